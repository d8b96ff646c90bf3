"""RL environments over sandboxes, in Gymnasium's shape (no Gymnasium needed).

An episode runs in one sandbox. Actions are shell commands (a ``str`` or
``Command``) or file edits (``WriteFile``, ``EditFile``); the observation is
their result as a dict; the reward is a function you give::

    from agentenv.rl import SandboxEnv, Command, EditFile

    def reward(env, action, obs):
        return 1.0 if obs.get("exit_code") == 0 else 0.0

    env = SandboxEnv("busybox", setup=lambda sbx, seed: sbx.files.write("/tmp/x", "1"), reward_fn=reward)
    obs, info = env.reset(seed=0)
    obs, r, terminated, truncated, info = env.step("cat /tmp/x")
    kids = env.fork(8)          # 8 environments continuing from this state
    snap = env.snapshot()       # replay later: SandboxEnv.from_snapshot(snap).reset()
    env.close()

``reset`` and ``step`` follow ``gymnasium.Env``: ``reset(seed=, options=)
-> (obs, info)``, ``step(a) -> (obs, reward, terminated, truncated, info)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .exceptions import TimeoutException
from .models import CommandExitException
from .sandbox import Sandbox


@dataclass
class Command:
    """Run ``cmd`` with ``/bin/bash -l -c`` (``cwd`` defaults to the env's workdir)."""

    cmd: str
    timeout: float = 60
    cwd: Optional[str] = None


@dataclass
class WriteFile:
    """Write ``content`` to ``path`` (replacing the file)."""

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
# reward_fn(env, action, observation) -> reward, or (reward, terminated)
RewardFn = Callable[["SandboxEnv", Any, Observation], Union[float, Tuple[float, bool]]]
SetupFn = Callable[[Sandbox, Optional[int]], Any]


def _parse(action: Action) -> Union[Command, WriteFile, EditFile]:
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
    :param setup: ``setup(sandbox, seed)`` run after each fresh sandbox (copy a repository in...)
    :param reward_fn: ``reward_fn(env, action, obs)`` -> reward or (reward, terminated); default 0
    :param max_steps: ``truncated`` becomes True at this many steps
    :param workdir: default directory of commands
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
        self.trajectory: List[Tuple[Any, Observation, float]] = []

    # -- Gymnasium's methods -------------------------------------------------

    def reset(self, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None) -> Tuple[Observation, Dict[str, Any]]:
        """Starts a new episode in a fresh sandbox (the old one is killed)."""
        self.close()
        t0 = time.monotonic()
        self.seed, self.steps, self.trajectory = seed, 0, []
        self.sandbox = Sandbox.create(self.template, timeout=self.sandbox_timeout, **self.sandbox_opts)
        try:
            if self.setup is not None:
                self.setup(self.sandbox, seed)
        except BaseException:
            self.close()
            raise
        obs: Observation = {"type": "reset", "template": self.template}
        return obs, self._info(t0)

    def step(self, action: Action) -> Tuple[Observation, float, bool, bool, Dict[str, Any]]:
        """Runs one action; returns (observation, reward, terminated, truncated, info)."""
        if self.sandbox is None:
            raise RuntimeError("call reset() before step()")
        t0 = time.monotonic()
        act = _parse(action)
        obs = self._act(act)
        self.steps += 1
        reward, terminated = 0.0, False
        if self.reward_fn is not None:
            r = self.reward_fn(self, act, obs)
            reward, terminated = (float(r[0]), bool(r[1])) if isinstance(r, tuple) else (float(r), False)
        truncated = self.max_steps is not None and self.steps >= self.max_steps and not terminated
        self.trajectory.append((act, obs, reward))
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
        (memory, processes, files, step count and trajectory), each in its
        own sandbox; this one goes on unchanged. For tree search."""
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
            env.sandbox, env.steps, env.seed, env.trajectory = sbx, self.steps, self.seed, list(self.trajectory)
            children.append(env)
        return children

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

    def _info(self, t0: float) -> Dict[str, Any]:
        return {"step": self.steps, "sandbox_id": self.sandbox.sandbox_id if self.sandbox else None,
                "seed": self.seed, "seconds": time.monotonic() - t0}

    def _act(self, act: Union[Command, WriteFile, EditFile]) -> Observation:
        assert self.sandbox is not None
        if isinstance(act, Command):
            try:
                r = self.sandbox.commands.run(act.cmd, cwd=act.cwd or self.workdir, timeout=act.timeout)
                return {"type": "command", "stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}
            except CommandExitException as e:
                return {"type": "command", "stdout": e.stdout, "stderr": e.stderr, "exit_code": e.exit_code}
            except TimeoutException as e:
                return {"type": "command", "stdout": "", "stderr": str(e), "exit_code": 124, "timed_out": True}
        path = act.path if act.path.startswith("/") else f"{self.workdir.rstrip('/')}/{act.path}"
        if isinstance(act, WriteFile):
            self.sandbox.files.write(path, act.content)
            return {"type": "write", "path": path, "ok": True}
        text = self.sandbox.files.read(path)
        if act.old not in text:
            return {"type": "edit", "path": path, "ok": False, "error": "text to replace not found"}
        self.sandbox.files.write(path, text.replace(act.old, act.new, 1))
        return {"type": "edit", "path": path, "ok": True}


# The name used in docs and examples: Env.from_snapshot(id).
Env = SandboxEnv
