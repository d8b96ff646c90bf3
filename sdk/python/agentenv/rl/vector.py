"""``SandboxVectorEnv``: N ``SandboxEnv`` stepped together, in the shape of
Gymnasium's ``VectorEnv`` (no Gymnasium or NumPy needed).

Each call runs the N sub-environments at once on a thread pool (their work
is network and sandbox time, not Python CPU). Batches are lists where
Gymnasium would give arrays: observations a list of dicts, rewards a list
of floats, terminations and truncations lists of bools; ``infos`` is
Gymnasium's vector form, a dict of lists with a ``"_key"`` mask beside each
key.
"""

from __future__ import annotations

import concurrent.futures
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .env import Action, Info, Observation, SandboxEnv


class AutoresetMode(str, Enum):
    """When a finished sub-environment starts its next episode (Gymnasium's modes)."""

    NEXT_STEP = "NextStep"
    """On the next ``step``: that sub-environment's action is ignored, it
    resets, and the step returns its first observation with reward 0 and
    terminated/truncated False (Gymnasium 1.x's default)."""
    SAME_STEP = "SameStep"
    """In the step that ended it: the returned observation is the new
    episode's, the last one is in ``infos["final_obs"]`` and its info in
    ``infos["final_info"]``."""
    DISABLED = "Disabled"
    """Never: reset it yourself, ``reset(options={"reset_mask": [...]})``."""


def _mode(m: Union[str, AutoresetMode]) -> AutoresetMode:
    if isinstance(m, AutoresetMode):
        return m
    key = str(m).replace("_", "").replace("-", "").lower()
    for mode in AutoresetMode:
        if mode.value.lower() == key:
            return mode
    raise ValueError(f"autoreset_mode {m!r}: use next_step, same_step or disabled")


class SandboxVectorEnv:
    """N ``SandboxEnv`` run concurrently; ``reset`` and ``step`` take and give batches.

    :param env_fns: one callable per sub-environment, returning a ``SandboxEnv``
    :param autoreset_mode: ``"next_step"`` (default), ``"same_step"`` or ``"disabled"``
    """

    action_space: Any = None
    observation_space: Any = None
    single_action_space: Any = None
    single_observation_space: Any = None

    def __init__(self, env_fns: Sequence[Callable[[], SandboxEnv]],
                 autoreset_mode: Union[str, AutoresetMode] = AutoresetMode.NEXT_STEP):
        if not env_fns:
            raise ValueError("give at least one environment")
        self.envs: List[SandboxEnv] = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.autoreset_mode = _mode(autoreset_mode)
        self.metadata: Dict[str, Any] = {"render_modes": [], "autoreset_mode": self.autoreset_mode}
        self.closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(self.num_envs, thread_name_prefix="agentenv-vec")
        # Sub-environments whose episode ended in the previous step (next_step mode).
        self._ended = [False] * self.num_envs
        self._observations: List[Optional[Observation]] = [e.observation for e in self.envs]

    @classmethod
    def from_envs(cls, envs: Sequence[SandboxEnv],
                  autoreset_mode: Union[str, AutoresetMode] = AutoresetMode.NEXT_STEP) -> "SandboxVectorEnv":
        """A vector env over environments that exist already (forks, say), as they are."""
        return cls([lambda e=e: e for e in envs], autoreset_mode=autoreset_mode)

    # -- Gymnasium's methods -------------------------------------------------

    def reset(self, seed: Union[None, int, Sequence[Optional[int]]] = None,
              options: Optional[Dict[str, Any]] = None) -> Tuple[List[Observation], Info]:
        """Resets every sub-environment (or those ``options["reset_mask"]``
        marks), at once. ``seed``: an int (sub-environment i gets seed + i),
        a list of seeds, or None. The other ``options`` go to each ``setup``."""
        seeds = self._seeds(seed)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        mask = [True] * self.num_envs if mask is None else [bool(m) for m in mask]
        if len(mask) != self.num_envs:
            raise ValueError(f"reset_mask has {len(mask)} entries for {self.num_envs} environments")
        opts = options or None
        results = self._map(lambda i: self.envs[i].reset(seed=seeds[i], options=opts) if mask[i] else None)
        infos: Info = {}
        for i, r in enumerate(results):
            if r is not None:
                self._observations[i] = r[0]
                self._ended[i] = False
                _add_info(infos, r[1], i, self.num_envs)
        return list(self._observations), infos  # type: ignore[arg-type]

    def step(self, actions: Sequence[Action]) -> Tuple[List[Observation], List[float], List[bool], List[bool], Info]:
        """One action per sub-environment, run at once; returns
        (observations, rewards, terminations, truncations, infos)."""
        if self.closed:
            raise RuntimeError("the vector env is closed")
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} environments")
        mode = self.autoreset_mode

        def one(i: int) -> Tuple[Observation, float, bool, bool, Info, Optional[Tuple[Observation, Info]]]:
            env = self.envs[i]
            if mode is AutoresetMode.NEXT_STEP and self._ended[i]:
                obs, info = env.reset()
                return obs, 0.0, False, False, info, None
            obs, r, term, trunc, info = env.step(actions[i])
            if mode is AutoresetMode.SAME_STEP and (term or trunc):
                new_obs, new_info = env.reset()
                return new_obs, r, term, trunc, new_info, (obs, info)
            return obs, r, term, trunc, info, None

        results = self._map(one)
        observations, rewards, terms, truncs, infos = [], [], [], [], {}  # type: ignore[var-annotated]
        for i, (obs, r, term, trunc, info, final) in enumerate(results):
            observations.append(obs)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            _add_info(infos, info, i, self.num_envs)
            if final is not None:
                _set(infos, "final_obs", i, final[0], self.num_envs)
                _set(infos, "final_info", i, final[1], self.num_envs)
            self._ended[i] = term or trunc
            self._observations[i] = obs
        return observations, rewards, terms, truncs, infos

    def close(self) -> None:
        """Closes every sub-environment (kills their sandboxes)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._map(lambda i: self.envs[i].close())
        finally:
            self._pool.shutdown(wait=True)

    def render(self) -> None:
        return None

    def __enter__(self) -> "SandboxVectorEnv":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return self.num_envs

    # -- internals -------------------------------------------------------------

    def _seeds(self, seed: Union[None, int, Sequence[Optional[int]]]) -> List[Optional[int]]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} environments")
        return seeds

    def _map(self, fn: Callable[[int], Any]) -> List[Any]:
        """fn(i) for every sub-environment at once; the first error is raised
        once all are done (so none is left running behind the caller)."""
        futures = [self._pool.submit(fn, i) for i in range(self.num_envs)]
        concurrent.futures.wait(futures)
        for f in futures:
            e = f.exception()
            if e is not None:
                raise e
        return [f.result() for f in futures]


def make_vec(num_envs: int, template: str = "base",
             autoreset_mode: Union[str, AutoresetMode] = AutoresetMode.NEXT_STEP, **env_kwargs: Any) -> SandboxVectorEnv:
    """``num_envs`` copies of ``SandboxEnv(template, **env_kwargs)`` as one vector env."""
    return SandboxVectorEnv([lambda: SandboxEnv(template, **env_kwargs) for _ in range(num_envs)],
                            autoreset_mode=autoreset_mode)


def _set(infos: Info, key: str, i: int, value: Any, n: int) -> None:
    if key not in infos:
        infos[key] = [None] * n
        infos["_" + key] = [False] * n
    infos[key][i] = value
    infos["_" + key][i] = True


def _add_info(infos: Info, info: Info, i: int, n: int) -> None:
    for k, v in info.items():
        _set(infos, k, i, v, n)
