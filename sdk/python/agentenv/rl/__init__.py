"""RL environments over sandboxes, in Gymnasium's shape (no Gymnasium needed).

An episode runs in one sandbox. Actions are shell commands (a ``str`` or
``Command``) or file edits (``WriteFile``, ``EditFile``); the observation is
their result as a dict with ``ok`` (and ``error`` when not ok: an action the
sandbox refuses is an observation, not an exception); the reward is a
function you give::

    from agentenv.rl import SandboxEnv, Command, EditFile

    def setup(sbx, seed, options):          # returns the initial observation
        sbx.files.write("/home/user/x", options["text"])
        return {"type": "reset", "task": options["text"]}

    def reward(env, action, obs):
        return 1.0 if obs["ok"] else 0.0

    env = SandboxEnv("base", setup=setup, reward_fn=reward)
    obs, info = env.reset(seed=0, options={"text": "1"})
    obs, r, terminated, truncated, info = env.step("cat x")
    group = env.fork_group(16)  # 16 continuations of this state, stepped together
    snap = env.snapshot()       # replay later: SandboxEnv.from_snapshot(snap).reset()
    env.close()

``SandboxEnv`` follows ``gymnasium.Env`` (``reset(seed=, options=) -> (obs,
info)``, ``step(a) -> (obs, reward, terminated, truncated, info)``);
``SandboxVectorEnv`` follows ``gymnasium.vector.VectorEnv`` (N at once,
autoreset, a task per sub-environment, ``step_async``/``step_wait``);
``AsyncSandboxEnv`` and ``AsyncSandboxVectorEnv`` are both on asyncio.
"""

from .aio import AsyncSandboxEnv, AsyncSandboxVectorEnv
from .env import Action, Command, EditFile, Observation, RunCode, SandboxEnv, WriteFile, parse_action
from .vector import AutoresetMode, SandboxVectorEnv, TaskSampler, make_vec

# The name used in docs and examples: Env.from_snapshot(id).
Env = SandboxEnv

__all__ = ["Action", "AsyncSandboxEnv", "AsyncSandboxVectorEnv", "AutoresetMode", "Command", "EditFile", "Env", "Observation", "RunCode", "SandboxEnv", "SandboxVectorEnv",
           "TaskSampler", "WriteFile", "make_vec", "parse_action"]
