"""``AsyncSandboxEnv`` and ``AsyncSandboxVectorEnv``: the RL environments on
asyncio, for async rollout workers.

Each call runs the blocking environment in a thread of the SDK's asyncio
pool (``agentenv.aio``), so hundreds of episodes can be awaited at once
from one event loop; the environments' own semantics are unchanged (see
``SandboxEnv`` and ``SandboxVectorEnv``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..aio import _run
from .env import Action, Info, Observation, SandboxEnv
from .vector import SandboxVectorEnv


class AsyncSandboxEnv:
    """``SandboxEnv`` on asyncio: ``obs, info = await env.reset(...)``,
    ``await env.step(action)``; ``async with`` closes it. Takes the
    arguments of ``SandboxEnv``, or wraps one (``AsyncSandboxEnv.wrap``)."""

    def __init__(self, template: str = "base", **kwargs: Any):
        self.sync = SandboxEnv(template, **kwargs)

    @classmethod
    def wrap(cls, env: SandboxEnv) -> "AsyncSandboxEnv":
        self = cls.__new__(cls)
        self.sync = env
        return self

    @property
    def sandbox(self) -> Any:
        return self.sync.sandbox

    @property
    def trajectory(self) -> List[Tuple[Any, Observation, float]]:
        return self.sync.trajectory

    @property
    def observation(self) -> Optional[Observation]:
        return self.sync.observation

    @property
    def steps(self) -> int:
        return self.sync.steps

    async def reset(self, seed: Optional[int] = None,
                    options: Optional[Dict[str, Any]] = None) -> Tuple[Observation, Info]:
        return await _run(self.sync.reset, seed=seed, options=options)

    async def step(self, action: Action) -> Tuple[Observation, float, bool, bool, Info]:
        return await _run(self.sync.step, action)

    async def fork(self, n: int) -> List["AsyncSandboxEnv"]:
        return [AsyncSandboxEnv.wrap(e) for e in await _run(self.sync.fork, n)]

    async def fork_group(self, n: int) -> "AsyncSandboxVectorEnv":
        return AsyncSandboxVectorEnv.wrap(await _run(self.sync.fork_group, n))

    async def snapshot(self, name: Optional[str] = None) -> str:
        return await _run(self.sync.snapshot, name)

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "AsyncSandboxEnv":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


class AsyncSandboxVectorEnv:
    """``SandboxVectorEnv`` on asyncio: ``await venv.reset(...)``,
    ``await venv.step(actions)``, ``await venv.step_ready()``. Takes the
    arguments of ``SandboxVectorEnv``, or wraps one."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.sync = SandboxVectorEnv(*args, **kwargs)

    @classmethod
    def wrap(cls, venv: SandboxVectorEnv) -> "AsyncSandboxVectorEnv":
        self = cls.__new__(cls)
        self.sync = venv
        return self

    @property
    def num_envs(self) -> int:
        return self.sync.num_envs

    @property
    def envs(self) -> List[SandboxEnv]:
        return self.sync.envs

    def __len__(self) -> int:
        return self.sync.num_envs

    async def reset(self, seed: Union[None, int, Sequence[Optional[int]]] = None,
                    options: Union[None, Dict[str, Any], Sequence[Optional[Dict[str, Any]]]] = None
                    ) -> Tuple[List[Observation], Info]:
        return await _run(self.sync.reset, seed=seed, options=options)

    async def step(self, actions: Sequence[Action]
                   ) -> Tuple[List[Observation], List[float], List[bool], List[bool], Info]:
        return await _run(self.sync.step, actions)

    def step_async(self, actions: Sequence[Optional[Action]]) -> None:
        """As ``SandboxVectorEnv.step_async`` (starts the steps, does not block)."""
        self.sync.step_async(actions)

    async def step_wait(self, timeout: Optional[float] = None
                        ) -> Tuple[List[Observation], List[float], List[bool], List[bool], Info]:
        return await _run(self.sync.step_wait, timeout)

    async def step_ready(self, timeout: Optional[float] = None
                         ) -> Dict[int, Tuple[Observation, float, bool, bool, Info]]:
        return await _run(self.sync.step_ready, timeout)

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "AsyncSandboxVectorEnv":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
