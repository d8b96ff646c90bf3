"""``SandboxVectorEnv``: N ``SandboxEnv`` stepped together, in the shape of
Gymnasium's ``VectorEnv`` (no Gymnasium or NumPy needed).

Each call runs the N sub-environments at once on a thread pool (their work
is network and sandbox time, not Python CPU). Batches are lists where
Gymnasium would give arrays: observations a list of dicts, rewards a list
of floats, terminations and truncations lists of bools; ``infos`` is
Gymnasium's vector form, a dict of lists with a ``"_key"`` mask beside each
key.

Each sub-environment can have its own task: ``reset(options=[...])`` gives
one options dict per sub-environment, and a ``task_sampler`` gives the
options of every reset, autoresets included. A sub-environment whose step
fails, its sandbox included (out of memory, lost, timed out), gives its
result like the others: an observation with ``ok`` False and a ``cause``
(see ``SandboxEnv``); it is truncated and autoreset starts it again in a new
sandbox. ``step_async``/``step_wait``/``step_ready`` step sub-environments
without waiting for the slowest.
"""

from __future__ import annotations

import concurrent.futures
import threading
from enum import Enum
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .. import exceptions as exc
from .env import Action, Info, Observation, SandboxEnv

# One sub-environment's step: (obs, reward, terminated, truncated, info, final)
# where final is (obs, info) of an episode that ended in it (same_step mode).
_Step = Tuple[Observation, float, bool, bool, Info, Optional[Tuple[Observation, Info]]]
# task_sampler(index, seed) -> options of that sub-environment's next reset;
# an iterator (a dataset's) works too: next(it) for every reset.
TaskSampler = Union[Callable[[int, Optional[int]], Optional[Dict[str, Any]]], Iterator[Dict[str, Any]]]


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
    :param task_sampler: gives the options (the task) of each reset that
        was given none, autoresets included: ``task_sampler(index, seed)``,
        or an iterator of options dicts (``iter(dataset)``)
    """

    action_space: Any = None
    observation_space: Any = None
    single_action_space: Any = None
    single_observation_space: Any = None

    def __init__(self, env_fns: Sequence[Callable[[], SandboxEnv]],
                 autoreset_mode: Union[str, AutoresetMode] = AutoresetMode.NEXT_STEP,
                 task_sampler: Optional[TaskSampler] = None):
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
        self.task_sampler = task_sampler
        self._sampler_lock = threading.Lock()  # an iterator is not thread-safe
        # Steps started by step_async and not yet collected, by sub-environment.
        self._pending: Dict[int, "concurrent.futures.Future[_Step]"] = {}

    @classmethod
    def from_envs(cls, envs: Sequence[SandboxEnv],
                  autoreset_mode: Union[str, AutoresetMode] = AutoresetMode.NEXT_STEP,
                  task_sampler: Optional[TaskSampler] = None) -> "SandboxVectorEnv":
        """A vector env over environments that exist already (forks, say), as they are."""
        return cls([lambda e=e: e for e in envs], autoreset_mode=autoreset_mode, task_sampler=task_sampler)

    # -- Gymnasium's methods -------------------------------------------------

    def reset(self, seed: Union[None, int, Sequence[Optional[int]]] = None,
              options: Union[None, Dict[str, Any], Sequence[Optional[Dict[str, Any]]]] = None
              ) -> Tuple[List[Observation], Info]:
        """Resets every sub-environment (or those ``options["reset_mask"]``
        marks), at once. ``seed``: an int (sub-environment i gets seed + i),
        a list of seeds, or None. ``options``: one dict for all (its other
        keys go to each ``setup``), or a list with one dict (or None) per
        sub-environment; a sub-environment given none gets the
        ``task_sampler``'s."""
        self._idle("reset")
        seeds = self._seeds(seed)
        per_env: List[Optional[Dict[str, Any]]]
        mask: Optional[Sequence[Any]] = None
        if options is None or isinstance(options, dict):
            shared = dict(options or {})
            mask = shared.pop("reset_mask", None)
            per_env = [shared or None] * self.num_envs
        else:
            per_env = [dict(o) if o is not None else None for o in options]
            if len(per_env) != self.num_envs:
                raise ValueError(f"{len(per_env)} options for {self.num_envs} environments")
        mask = [True] * self.num_envs if mask is None else [bool(m) for m in mask]
        if len(mask) != self.num_envs:
            raise ValueError(f"reset_mask has {len(mask)} entries for {self.num_envs} environments")
        results = self._map(lambda i: self._reset_one(i, seeds[i], per_env[i]) if mask[i] else None)
        infos: Info = {}
        for i, r in enumerate(results):
            if r is not None:
                self._observations[i] = r[0]
                self._ended[i] = False
                _add_info(infos, r[1], i, self.num_envs)
        return list(self._observations), infos  # type: ignore[arg-type]

    def step(self, actions: Sequence[Action]) -> Tuple[List[Observation], List[float], List[bool], List[bool], Info]:
        """One action per sub-environment, run at once; returns
        (observations, rewards, terminations, truncations, infos). A
        sub-environment whose step failed is in the batch like the others
        (``ok`` False, a ``cause``)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Optional[Action]]) -> None:
        """Starts one step of each sub-environment whose action is not None
        and returns at once; ``step_wait`` or ``step_ready`` collect them. A
        sub-environment still stepping cannot be given another action."""
        if self.closed:
            raise RuntimeError("the vector env is closed")
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} environments")
        busy = [i for i, a in enumerate(actions) if a is not None and i in self._pending]
        if busy:
            raise RuntimeError(f"sub-environments {busy} are still stepping: collect them with step_wait or "
                               f"step_ready first (or give them None)")
        for i, a in enumerate(actions):
            if a is not None:
                self._pending[i] = self._pool.submit(self._step_one, i, a)

    def step_wait(self, timeout: Optional[float] = None
                  ) -> Tuple[List[Observation], List[float], List[bool], List[bool], Info]:
        """Waits for every started step and returns the batch, as ``step``.
        Sub-environments that were not stepped keep their last observation,
        with reward 0, not terminated or truncated, and ``infos["_stepped"]``
        False. ``timeout`` (s): raise ``TimeoutError`` if they are not all
        done by then (they stay pending)."""
        pending = dict(self._pending)
        done, not_done = concurrent.futures.wait(list(pending.values()), timeout=timeout)
        if not_done:
            raise TimeoutError(f"{len(not_done)} of {len(pending)} steps are still running after {timeout} s")
        ready = self._collect(pending)
        observations = list(self._observations)
        rewards, terms, truncs = [0.0] * self.num_envs, [False] * self.num_envs, [False] * self.num_envs
        infos: Info = {}
        for i in range(self.num_envs):
            _set(infos, "stepped", i, i in ready, self.num_envs)
        for i, (obs, r, term, trunc, info, final) in ready.items():
            observations[i], rewards[i], terms[i], truncs[i] = obs, r, term, trunc
            _add_info(infos, info, i, self.num_envs)
            if final is not None:
                _set(infos, "final_obs", i, final[0], self.num_envs)
                _set(infos, "final_info", i, final[1], self.num_envs)
        return observations, rewards, terms, truncs, infos

    def step_ready(self, timeout: Optional[float] = None) -> Dict[int, Tuple[Observation, float, bool, bool, Info]]:
        """The steps that are done, without waiting for the others: waits
        until at least one is (or ``timeout`` s pass: then maybe none) and
        returns ``{index: (obs, reward, terminated, truncated, info)}``. The
        rest stay pending; give the ready ones their next action with
        ``step_async`` (None for the others). In same_step mode an ended
        episode's last observation is in ``info["final_obs"]``."""
        pending = dict(self._pending)
        if not pending:
            return {}
        done, _ = concurrent.futures.wait(list(pending.values()), timeout=timeout,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        ready = self._collect({i: f for i, f in pending.items() if f in done})
        out = {}
        for i, (obs, r, term, trunc, info, final) in ready.items():
            if final is not None:
                info = dict(info, final_obs=final[0], final_info=final[1])
            out[i] = (obs, r, term, trunc, info)
        return out

    @property
    def pending(self) -> List[int]:
        """Sub-environments with a step started and not yet collected."""
        return sorted(self._pending)

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

    def _idle(self, what: str) -> None:
        if self._pending:
            raise RuntimeError(f"{what}: sub-environments {self.pending} are still stepping; collect them first")

    def _options(self, i: int, seed: Optional[int], given: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if given is not None or self.task_sampler is None:
            return given
        sampler = self.task_sampler
        if hasattr(sampler, "__next__"):
            with self._sampler_lock:
                return next(sampler)  # type: ignore[call-overload]
        return sampler(i, seed)  # type: ignore[operator]

    def _reset_one(self, i: int, seed: Optional[int], options: Optional[Dict[str, Any]] = None) -> Tuple[Observation, Info]:
        return self.envs[i].reset(seed=seed, options=self._options(i, seed, options))

    def _step_one(self, i: int, action: Action) -> _Step:
        env, mode = self.envs[i], self.autoreset_mode
        if mode is AutoresetMode.NEXT_STEP and self._ended[i]:
            obs, info = self._reset_one(i, None)
            return obs, 0.0, False, False, info, None
        try:
            obs, r, term, trunc, info = env.step(action)
        except exc.AuthenticationException:
            raise
        except exc.SandboxException as e:
            # What the env could not make an observation of (the server
            # answered an error it does not know): this member's result
            # all the same, so the batch is whole.
            obs = {"type": "error", "ok": False, "cause": "error", "error": str(e)[:300]}
            r, term, trunc, info = 0.0, False, True, {"step": env.steps, "exception": e}
        if mode is AutoresetMode.SAME_STEP and (term or trunc):
            new_obs, new_info = self._reset_one(i, None)
            return new_obs, r, term, trunc, new_info, (obs, info)
        return obs, r, term, trunc, info, None

    def _collect(self, futures: Dict[int, "concurrent.futures.Future[_Step]"]) -> Dict[int, _Step]:
        """The results of finished steps, which stop being pending; the
        first error is raised once all of them are collected."""
        out: Dict[int, _Step] = {}
        first: Optional[BaseException] = None
        for i, f in futures.items():
            del self._pending[i]
            e = f.exception()
            if e is not None:
                first = first or e
                continue
            res = out[i] = f.result()
            self._ended[i] = res[2] or res[3]
            self._observations[i] = res[0]
        if first is not None:
            raise first
        return out

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
             autoreset_mode: Union[str, AutoresetMode] = AutoresetMode.NEXT_STEP,
             task_sampler: Optional[TaskSampler] = None, **env_kwargs: Any) -> SandboxVectorEnv:
    """``num_envs`` copies of ``SandboxEnv(template, **env_kwargs)`` as one vector env."""
    return SandboxVectorEnv([lambda: SandboxEnv(template, **env_kwargs) for _ in range(num_envs)],
                            autoreset_mode=autoreset_mode, task_sampler=task_sampler)


def _set(infos: Info, key: str, i: int, value: Any, n: int) -> None:
    if key not in infos:
        infos[key] = [None] * n
        infos["_" + key] = [False] * n
    infos[key][i] = value
    infos["_" + key][i] = True


def _add_info(infos: Info, info: Info, i: int, n: int) -> None:
    for k, v in info.items():
        _set(infos, k, i, v, n)
