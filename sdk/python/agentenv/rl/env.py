"""``SandboxEnv``: one RL environment over one sandbox at a time, in
Gymnasium's shape, and its actions.

An action the sandbox refuses (a missing file, a permission, a path that is
a directory, a non-zero exit, a timeout) is part of the episode: ``step``
returns it as an observation with ``ok`` False and a short ``error``, counts
the step and keeps it in the trajectory. Only failures of the environment
itself (the sandbox gone, the server unreachable, a bad API key) raise.
"""

from __future__ import annotations

import inspect
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
    workdir); after ``timeout`` seconds it is killed (0: no limit)."""

    cmd: str
    timeout: float = 60
    cwd: Optional[str] = None


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


Action = Union[str, Command, WriteFile, EditFile, Dict[str, Any]]
Observation = Dict[str, Any]
Info = Dict[str, Any]
# reward_fn(env, action, observation) -> reward, or (reward, terminated)
RewardFn = Callable[["SandboxEnv", Any, Observation], Union[float, Tuple[float, bool]]]
# setup(sandbox, seed, options) -> the initial observation (None: a default one).
# A two-argument setup(sandbox, seed) is accepted too.
SetupFn = Callable[..., Any]

# Longest error text an observation carries (the server's words, one line).
_ERROR_CHARS = 300


def parse_action(action: Action) -> Union[Command, WriteFile, EditFile]:
    """An action as a ``Command``, ``WriteFile`` or ``EditFile`` (a ``str``
    is a command; a dict names its kind in ``"type"``)."""
    if isinstance(action, (Command, WriteFile, EditFile)):
        return action
    if isinstance(action, str):
        return Command(action)
    if isinstance(action, dict):
        kind = action.get("type", "command")
        fields = {k: v for k, v in action.items() if k != "type"}
        cls = {"command": Command, "write": WriteFile, "edit": EditFile}.get(kind)
        if cls is None:
            raise ValueError(f"action type {kind!r}: use command, write or edit")
        return cls(**fields)  # type: ignore[arg-type]
    raise TypeError(f"action of type {type(action).__name__}: give a str, Command, WriteFile, EditFile or dict")


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
    :param sandbox_opts: passed to ``Sandbox.create`` (``api_key``, ``api_url``, ``envs``...)
    """

    metadata: Dict[str, Any] = {"render_modes": []}
    # Text in, dicts out: no Gymnasium space objects without Gymnasium.
    action_space: Any = None
    observation_space: Any = None

    def __init__(self, template: str = "base", setup: Optional[SetupFn] = None,
                 reward_fn: Optional[RewardFn] = None, max_steps: Optional[int] = None,
                 workdir: str = "/home/user", sandbox_timeout: int = 600, **sandbox_opts: Any):
        self.template, self.setup, self.reward_fn = template, setup, reward_fn
        self.max_steps, self.workdir, self.sandbox_timeout = max_steps, workdir, sandbox_timeout
        self.sandbox_opts = sandbox_opts
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
        self.seed, self.steps, self.trajectory = seed, 0, []
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
        obs = self._act(act)
        self.steps += 1
        reward, terminated = 0.0, False
        if self.reward_fn is not None:
            r = self.reward_fn(self, act, obs)
            reward, terminated = (float(r[0]), bool(r[1])) if isinstance(r, tuple) else (float(r), False)
        truncated = self.max_steps is not None and self.steps >= self.max_steps and not terminated
        self.trajectory.append((act, obs, reward))
        self.observation = obs
        return obs, reward, terminated, truncated, self._info(t0)

    def close(self) -> None:
        """Kills the sandbox of the current episode."""
        if self.sandbox is not None:
            sbx, self.sandbox = self.sandbox, None
            sbx.kill()

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
                          workdir=self.workdir, sandbox_timeout=self.sandbox_timeout, **self.sandbox_opts)

    def _info(self, t0: float) -> Info:
        return {"step": self.steps, "sandbox_id": self.sandbox.sandbox_id if self.sandbox else None,
                "seed": self.seed, "seconds": time.monotonic() - t0}

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    def _act(self, act: Union[Command, WriteFile, EditFile]) -> Observation:
        if isinstance(act, Command):
            return self._command(act)
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
                    return _failed(kind, path, f"the text to replace is not in {path}")
                self._sbx.files.write(path, text.replace(act.old, act.new, 1))
        except exc.SandboxException as e:
            error = _refusal(e)
            if error is None:
                raise
            return _failed(kind, path, error)
        return {"type": kind, "path": path, "ok": True}

    def _command(self, act: Command) -> Observation:
        # Output is gathered as it comes, so a timeout keeps what came.
        out: List[str] = []
        err: List[str] = []
        obs: Observation = {"type": "command", "ok": True, "stdout": "", "stderr": "", "exit_code": 0}
        try:
            self._sbx.commands.run(act.cmd, cwd=act.cwd or self.workdir, timeout=act.timeout,
                                   on_stdout=out.append, on_stderr=err.append)
        except CommandExitException as e:
            obs.update(ok=False, exit_code=e.exit_code, error=f"exit code {e.exit_code}")
        except exc.TimeoutException as e:
            if e.error_code != "deadline_exceeded":
                raise  # not the command's own time limit: the sandbox is gone or unreachable
            obs.update(ok=False, exit_code=124, timed_out=True, error=f"timed out after {act.timeout:g} s")
        except exc.SandboxException as e:
            # Refused before it ran (a missing or forbidden working directory).
            error = _refusal(e)
            if error is None:
                raise
            obs.update(ok=False, exit_code=None, error=error)
        obs["stdout"], obs["stderr"] = "".join(out), "".join(err)
        return obs

    @property
    def _sbx(self) -> Sandbox:
        assert self.sandbox is not None
        return self.sandbox


def _failed(kind: str, path: str, error: str) -> Observation:
    return {"type": kind, "path": path, "ok": False, "error": error}


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
