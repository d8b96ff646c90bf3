"""``SandboxEnv``: one RL environment over one sandbox at a time, in
Gymnasium's shape, and its actions.

An action that fails is part of the episode: ``step`` returns it as an
observation with ``ok`` False, a short ``error`` and its ``cause``, counts
the step and keeps it in the trajectory. Causes: "exit" (a non-zero exit),
"command_timeout" (the action's timeout; the output so far is kept),
"refused" (a missing file, a permission, a path that is a directory), and
the ends of the sandbox itself: "oom", "lost", "sandbox_timeout",
"killed". After the sandbox ended, every step returns that failure again
with ``truncated`` True (no request is made) until ``reset`` starts a new
sandbox. Only failures of the client itself (the server unreachable, a bad
API key) raise.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

from .. import exceptions as exc
from ..models import CommandExitException
from ..sandbox import Sandbox

if TYPE_CHECKING:
    from .vector import SandboxVectorEnv


@dataclass
class Command:
    """Run ``cmd`` with ``/bin/bash -l -c`` (``cwd`` defaults to the env's
    workdir); after ``timeout`` seconds it is killed (0: no limit).

    The observation keeps at most ``max_output`` characters of stdout and
    of stderr each (the env's ``max_output`` when None); its
    ``stdout_truncated``/``stderr_truncated`` say whether some was cut.

    A job it starts in the background (``server &``) does not hold the
    step open: with ``detach`` (None: when ``cmd`` has a ``&`` that may
    start one) its stdout and stderr go to files in the sandbox and come
    back, cut there, when its shell exits; the job keeps running, its later
    output going nowhere (redirect it: ``server > log 2>&1 &``). That costs
    a few ms (a process or two in the sandbox), so commands without ``&``
    stream as they are."""

    cmd: str
    timeout: float = 60
    cwd: Optional[str] = None
    max_output: Optional[int] = None
    detach: Optional[bool] = None


@dataclass
class WriteFile:
    """Write ``content`` to ``path`` (replacing the file; parents are created)."""

    path: str
    content: Union[str, bytes]


@dataclass
class EditFile:
    """Replace the first occurrence of ``old`` with ``new`` in ``path`` (a search/replace edit)."""

    path: str
    old: str
    new: str


@dataclass
class RunCode:
    """Run ``code`` in the sandbox's code interpreter (a template built with
    ``--code-interpreter``, such as ``code-interpreter-v1``): a Jupyter
    kernel whose variables last from step to step, as E2B's ``run_code``.
    The observation has the main result's ``text``, ``stdout``,
    ``stderr``, every ``results`` entry's formats (``png``, ``html``,
    ``data``...) and, when the cell raised, ``ok`` False with cause
    "error" and the exception's ``name``, ``value`` and ``traceback``. A
    cell past ``timeout`` seconds is interrupted (cause
    "command_timeout"); the kernel keeps its state."""

    code: str
    timeout: float = 60
    language: Optional[str] = None


Action = Union[str, Command, WriteFile, EditFile, RunCode, Dict[str, Any]]
_action_ids = itertools.count()  # thread-safe in CPython: next() holds the GIL
Observation = Dict[str, Any]
Info = Dict[str, Any]
# reward_fn(env, action, observation) -> reward, or (reward, terminated)
RewardFn = Callable[["SandboxEnv", Any, Observation], Union[float, Tuple[float, bool]]]
# setup(sandbox, seed, options) -> the initial observation (None: a default one).
# A two-argument setup(sandbox, seed) is accepted too.
SetupFn = Callable[..., Any]

# Longest error text an observation carries (the server's words, one line).
_ERROR_CHARS = 300
# Characters of stdout and of stderr an action's observation keeps by default.
DEFAULT_MAX_OUTPUT = 1 << 20
# Where an action's output waits in the sandbox until its shell exits (a
# name per action follows).
_OUT = "/tmp/.agentenv-action-"


def _result_obs(r: Any) -> Dict[str, Any]:
    """A code interpreter result as a plain dict of its formats."""
    d = {f: getattr(r, f) for f in r.formats() if f not in r.extra}
    d.update(r.extra)
    d.update(text=r.text, is_main_result=r.is_main_result)
    return d


def parse_action(action: Action) -> Union[Command, WriteFile, EditFile, RunCode]:
    """An action as a ``Command``, ``WriteFile``, ``EditFile`` or ``RunCode``
    (a ``str`` is a command; a dict names its kind in ``"type"``)."""
    if isinstance(action, (Command, WriteFile, EditFile, RunCode)):
        return action
    if isinstance(action, str):
        return Command(action)
    if isinstance(action, dict):
        kind = action.get("type", "command")
        fields = {k: v for k, v in action.items() if k != "type"}
        cls = {"command": Command, "write": WriteFile, "edit": EditFile, "run_code": RunCode}.get(kind)
        if cls is None:
            raise ValueError(f"action type {kind!r}: use command, write, edit or run_code")
        return cls(**fields)  # type: ignore[arg-type]
    raise TypeError(f"action of type {type(action).__name__}: give a str, Command, WriteFile, EditFile, RunCode or dict")


class SandboxEnv:
    """One environment = one sandbox at a time.

    :param template: template name or snapshot ID each ``reset`` starts from
    :param setup: ``setup(sandbox, seed, options)`` run after each fresh
        sandbox (copy a repository in...); what it returns is the initial
        observation (``None``: ``{"type": "reset", "template": ...}``)
    :param reward_fn: ``reward_fn(env, action, obs)`` -> reward or (reward, terminated); default 0
    :param max_steps: ``truncated`` becomes True at this many steps
    :param workdir: directory of commands and of relative paths
    :param sandbox_timeout: seconds each sandbox may live
    :param max_output: characters of stdout and of stderr each command
        action keeps (the rest is cut in the sandbox, never sent)
    :param sandbox_opts: passed to ``Sandbox.create`` (``api_key``, ``api_url``, ``envs``...)
        including its sizes and network: ``memory_mb``, ``cpu_count``, ``allow_internet_access``,
        ``network``; a keyword ``Sandbox.create`` does not take raises ``TypeError`` here
    """

    metadata: Dict[str, Any] = {"render_modes": []}
    # Text in, dicts out: no Gymnasium space objects without Gymnasium.
    action_space: Any = None
    observation_space: Any = None

    def __init__(self, template: str = "base", setup: Optional[SetupFn] = None,
                 reward_fn: Optional[RewardFn] = None, max_steps: Optional[int] = None,
                 workdir: str = "/home/user", sandbox_timeout: int = 600, max_output: int = DEFAULT_MAX_OUTPUT,
                 **sandbox_opts: Any):
        self.template, self.setup, self.reward_fn = template, setup, reward_fn
        self.max_output = max_output
        # How the current sandbox ended (an observation with ok False), if it did.
        self.ended: Optional[Observation] = None
        self.max_steps, self.workdir, self.sandbox_timeout = max_steps, workdir, sandbox_timeout
        self.sandbox_opts = sandbox_opts
        Sandbox.check_create_options(sandbox_opts, "SandboxEnv()", taken=("timeout",))  # sandbox_timeout
        self.sandbox: Optional[Sandbox] = None
        self.steps = 0
        self.seed: Optional[int] = None
        self.observation: Optional[Observation] = None  # the latest, from reset or step
        self.trajectory: List[Tuple[Any, Observation, float]] = []
        self._setup_takes_options = _takes_options(setup)

    # -- Gymnasium's methods -------------------------------------------------

    def reset(self, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None) -> Tuple[Observation, Info]:
        """Starts a new episode in a fresh sandbox (the old one is killed);
        ``options`` go to ``setup``, whose return value is the observation."""
        self.close()
        t0 = time.monotonic()
        self.seed, self.steps, self.trajectory, self.ended = seed, 0, [], None
        self.sandbox = Sandbox.create(self.template, timeout=self.sandbox_timeout, **self.sandbox_opts)
        obs: Any = None
        try:
            if self.setup is not None:
                obs = (self.setup(self.sandbox, seed, options) if self._setup_takes_options
                       else self.setup(self.sandbox, seed))
        except BaseException:
            self.close()
            raise
        if obs is None:
            obs = {"type": "reset", "template": self.template}
        self.observation = obs
        return obs, self._info(t0)

    def step(self, action: Action) -> Tuple[Observation, float, bool, bool, Info]:
        """Runs one action; returns (observation, reward, terminated, truncated, info)."""
        if self.sandbox is None:
            raise RuntimeError("call reset() before step()")
        t0 = time.monotonic()
        act = parse_action(action)
        obs = dict(self.ended) if self.ended is not None else self._act(act)
        if _sandbox_ended(obs) and self.ended is None:
            self.ended = dict(obs)
        self.steps += 1
        reward, terminated = 0.0, False
        if self.reward_fn is not None:
            r = self.reward_fn(self, act, obs)
            reward, terminated = (float(r[0]), bool(r[1])) if isinstance(r, tuple) else (float(r), False)
        truncated = self.max_steps is not None and self.steps >= self.max_steps and not terminated
        if self.ended is not None and not terminated:
            truncated = True  # the sandbox is gone: the episode cannot go on
        self.trajectory.append((act, obs, reward))
        self.observation = obs
        return obs, reward, terminated, truncated, self._info(t0)

    def close(self) -> None:
        """Kills the sandbox of the current episode."""
        if self.sandbox is not None:
            sbx, self.sandbox = self.sandbox, None
            try:
                sbx.kill()
            except exc.SandboxException:
                if self.ended is None:
                    raise  # it ended already: nothing is left to kill

    def render(self) -> None:
        return None

    def __enter__(self) -> "SandboxEnv":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- branching and replay -------------------------------------------------

    def fork(self, n: int) -> List["SandboxEnv"]:
        """``n`` environments that continue from this one's current state
        (memory, processes, files, step count, observation and trajectory),
        each in its own sandbox; this one goes on unchanged. For tree search.
        Raises (and kills the children that did start) if any child failed."""
        if self.sandbox is None:
            raise RuntimeError("call reset() before fork()")
        results = self.sandbox.fork(timeout=self.sandbox_timeout, count=n)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            for r in results:
                if isinstance(r, Sandbox):
                    r.kill()
            raise failed[0]
        children = []
        for sbx in results:
            env = self._like(self.template)
            env.sandbox, env.steps, env.seed = sbx, self.steps, self.seed
            env.observation, env.trajectory = self.observation, list(self.trajectory)
            children.append(env)
        return children

    def fork_group(self, n: int) -> "SandboxVectorEnv":
        """A group of ``n`` continuations of this state, stepped together:
        a ``SandboxVectorEnv`` over ``fork(n)`` with autoreset off (a
        finished member stays where it ended). For GRPO-style groups;
        ``group.close()`` kills them all."""
        from .vector import SandboxVectorEnv
        return SandboxVectorEnv.from_envs(self.fork(n), autoreset_mode="disabled")

    def snapshot(self, name: Optional[str] = None) -> str:
        """Snapshots the current state; returns an ID for ``SandboxEnv.from_snapshot``."""
        if self.sandbox is None:
            raise RuntimeError("call reset() before snapshot()")
        return self.sandbox.create_snapshot(name=name, metadata={"steps": str(self.steps)}).snapshot_id

    @classmethod
    def from_snapshot(cls, snapshot_id: str, reward_fn: Optional[RewardFn] = None, **kwargs: Any) -> "SandboxEnv":
        """An environment whose every ``reset()`` starts from the snapshot (no setup is run)."""
        return cls(template=snapshot_id, reward_fn=reward_fn, **kwargs)

    # -- internals -------------------------------------------------------------

    def _like(self, template: str) -> "SandboxEnv":
        return type(self)(template=template, setup=self.setup, reward_fn=self.reward_fn, max_steps=self.max_steps,
                          workdir=self.workdir, sandbox_timeout=self.sandbox_timeout, max_output=self.max_output,
                          **self.sandbox_opts)

    def _info(self, t0: float) -> Info:
        return {"step": self.steps, "sandbox_id": self.sandbox.sandbox_id if self.sandbox else None,
                "seed": self.seed, "seconds": time.monotonic() - t0}

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    def _act(self, act: Union[Command, WriteFile, EditFile, RunCode]) -> Observation:
        if isinstance(act, Command):
            return self._command(act)
        if isinstance(act, RunCode):
            return self._run_code(act)
        path = self._path(act.path)
        kind = "write" if isinstance(act, WriteFile) else "edit"
        try:
            if isinstance(act, WriteFile):
                self._sbx.files.write(path, act.content)
            else:
                try:
                    text = self._sbx.files.read(path)
                except UnicodeDecodeError:
                    return _failed(kind, path, f"{path} is not a UTF-8 text file")
                if act.old not in text:
                    return dict(_failed(kind, path, f"the text to replace is not in {path}"), cause="no_match")
                self._sbx.files.write(path, text.replace(act.old, act.new, 1))
        except exc.SandboxException as e:
            ended = _ended(e)
            if ended is not None:
                return dict(_failed(kind, path, ended[1]), cause=ended[0])
            error = _refusal(e)
            if error is None:
                raise
            return _failed(kind, path, error)
        return {"type": kind, "path": path, "ok": True}

    def _run_code(self, act: RunCode) -> Observation:
        from ..code_interpreter import Sandbox as CodeSandbox

        sbx = self._sbx
        ci = CodeSandbox(sbx.sandbox_id, sbx._envd_access_token, sbx.connection_config, sbx.sandbox_domain)
        obs: Observation = {"type": "run_code", "ok": True, "text": None, "stdout": "", "stderr": "", "results": []}
        try:
            ex = ci.run_code(act.code, language=act.language, timeout=act.timeout)
        except exc.TimeoutException:
            return dict(obs, ok=False, cause="command_timeout", timed_out=True,
                        error=f"the cell ran longer than {act.timeout:g} s and was interrupted")
        except exc.SandboxException as e:
            ended = _ended(e)
            if ended is None:
                raise
            return dict(obs, ok=False, cause=ended[0], error=ended[1])
        obs.update(text=ex.text, stdout="".join(ex.logs.stdout), stderr="".join(ex.logs.stderr),
                   execution_count=ex.execution_count,
                   results=[_result_obs(r) for r in ex.results])
        if ex.error is not None:
            obs.update(ok=False, cause="error", error=f"{ex.error.name}: {ex.error.value}"[:_ERROR_CHARS],
                       name=ex.error.name, value=ex.error.value, traceback=ex.error.traceback)
        return obs

    def _command(self, act: Command) -> Observation:
        cap = self.max_output if act.max_output is None else act.max_output
        obs: Observation = {"type": "command", "ok": True, "stdout": "", "stderr": "", "exit_code": 0}
        detach = _may_background(act.cmd) if act.detach is None else act.detach
        out = f"{_OUT}{os.getpid()}-{next(_action_ids)}"
        try:
            self._sbx.commands.run(_detached(act.cmd, cap, out) if detach else act.cmd, cwd=act.cwd or self.workdir, timeout=act.timeout,
                                   on_stdout=lambda o: _put(obs, "stdout", o),
                                   on_stderr=lambda e: _put(obs, "stderr", e), max_output=cap + 1)
        except CommandExitException as e:
            cause = "oom" if _says_oom(e.error) else "exit"
            obs.update(ok=False, exit_code=e.exit_code, cause=cause, error=f"exit code {e.exit_code}")
        except exc.SandboxException as e:
            if isinstance(e, exc.TimeoutException) and e.cause == "command_timeout":
                obs.update(ok=False, exit_code=124, timed_out=True, cause="command_timeout",
                           error=f"timed out after {act.timeout:g} s")
                if detach:
                    self._leftover(obs, cap, out)
            elif _ended(e) is not None:
                cause, error = _ended(e)  # type: ignore[misc]
                obs.update(ok=False, exit_code=None, cause=cause, error=error)
            else:
                # Refused before it ran (a missing or forbidden working directory).
                error = _refusal(e)
                if error is None:
                    raise
                obs.update(ok=False, exit_code=None, cause="refused", error=error)
        for name in ("stdout", "stderr"):
            # Kept one character over the cap: that one says it was cut.
            if len(obs[name]) > cap:
                obs[name], obs[name + "_truncated"] = obs[name][:cap], True
        return obs

    def _leftover(self, obs: Observation, cap: int, out: str) -> None:
        """The output a timed-out action left in its files (its shell was
        killed before it could send them); best effort."""
        try:
            r = self._sbx.commands.run(f'head -c {cap + 1} "{out}.o"; head -c {cap + 1} "{out}.e" >&2; '
                                       f'rm -f "{out}.o" "{out}.e"; true', timeout=10, max_output=cap + 1)
        except exc.SandboxException:
            return
        obs["stdout"], obs["stderr"] = r.stdout, r.stderr

    @property
    def _sbx(self) -> Sandbox:
        assert self.sandbox is not None
        return self.sandbox


def _detached(cmd: str, cap: int, out: str) -> str:
    """cmd, run so that what it starts in the background cannot hold the
    action open: envd ends a command's stream when its stdout and stderr
    pipes close, and a background job keeps them open for as long as it
    runs. Its output goes to files (out.o, out.e) that the shell sends, cut,
    on exit. POSIX sh (busybox's bash is ash); an empty file costs no
    process (head, rm are processes: a few ms each in gVisor), and the
    empty files of earlier actions go with the next rm."""
    n = cap + 1
    return (f'__o={out}; (\n{cmd}\n) >"$__o.o" 2>"$__o.e" </dev/null; __rc=$?; '
            f'if [ -s "$__o.o" ] || [ -s "$__o.e" ]; then '
            f'[ -s "$__o.o" ] && head -c {n} "$__o.o"; [ -s "$__o.e" ] && head -c {n} "$__o.e" >&2; '
            f'rm -f {_OUT}*; fi; exit $__rc')


# A "&" that is an operator, not part of "&&", ">&", "&>", "|&" or "<&".
_BACKGROUND = re.compile(r"(?<![&>|<])&(?![&>])")


def _may_background(cmd: str) -> bool:
    """Whether cmd may start a background job (quotes are not parsed: a
    quoted "&" detaches too, which costs only time)."""
    return bool(_BACKGROUND.search(cmd))


def _put(obs: Observation, name: str, text: str) -> None:
    obs[name] += text


_SANDBOX_ENDS = ("oom", "lost", "sandbox_timeout", "killed")


def _sandbox_ended(obs: Observation) -> bool:
    return obs.get("cause") in _SANDBOX_ENDS and obs.get("exit_code") is None


def _ended(e: exc.SandboxException) -> Optional[Tuple[str, str]]:
    """(cause, error) when e says the sandbox itself ended; None otherwise."""
    if not isinstance(e, exc.SandboxNotFoundException) and e.cause != "sandbox_timeout":
        return None
    cause = e.cause or "killed"
    text = (e.reason or e.message).strip().splitlines() or [type(e).__name__]
    error = text[0] if len(text[0]) <= _ERROR_CHARS else text[0][:_ERROR_CHARS - 1] + "…"
    return cause, error


def _says_oom(error: Optional[str]) -> bool:
    return bool(error) and any(w in error.lower() for w in ("out of memory", "oom"))  # type: ignore[union-attr]


def _failed(kind: str, path: str, error: str) -> Observation:
    return {"type": kind, "path": path, "ok": False, "error": error, "cause": "refused"}


def _refusal(e: exc.SandboxException) -> Optional[str]:
    """The error an agent sees for an action the sandbox refused: the
    server's own words (no SDK or RPC context), one line. None for what is
    not the action's doing (the sandbox gone, a request timeout, a server
    error): that is raised."""
    refused = (isinstance(e, (exc.NotFoundException, exc.InvalidArgumentException, exc.NotEnoughSpaceException,
                              exc.ConflictException))
               or e.status_code == 403 or e.error_code == "permission_denied")
    if not refused or isinstance(e, exc.SandboxNotFoundException):
        return None
    lines = (e.reason or e.message).strip().splitlines() or [type(e).__name__]
    text = lines[0]
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS - 1] + "…"


def _takes_options(setup: Optional[SetupFn]) -> bool:
    """Whether setup takes (sandbox, seed, options) rather than (sandbox, seed)."""
    if setup is None:
        return False
    try:
        inspect.signature(setup).bind(None, None, None)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): assume the current form
        return True
    return True
