"""GRPO over a dataset of tasks: each iteration draws a batch of tasks, gives
each one to its own environment through per-env options (a task sampler on
the vector env), forks each into a group, scores the group's patches with
the task's own tests, and updates the policy with group-relative advantages.

    python3 examples/grpo_tasks.py --batch 3 --group 8 --iterations 2

A member whose sandbox fails (out of memory, lost, timed out) is an
observation with ok False and reward 0 like any other: the group keeps all
its results. The policy is a softmax over each task's candidate patches,
standing in for a model.
"""

import argparse
import itertools
import math
import random
import re
import statistics
import time

from agentenv.rl import Command, EditFile, SandboxEnv, SandboxVectorEnv

REPO = "/home/user/repo"
TEST = "python3 -m unittest test_task 2>&1"

# The dataset: a module with a bug, its tests, and what a model might
# propose for the buggy line (the last proposal is right).
DATASET = [
    {"name": "median",
     "source": "def f(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n",
     "tests": "self.assertEqual(f([3, 1, 2]), 2)\n        self.assertEqual(f([4, 1, 3, 2]), 2.5)",
     "buggy": "    return xs[len(xs) // 2]\n",
     "patches": ["    return xs[len(xs) // 2]\n", "    return xs[(len(xs) - 1) // 2]\n",
                 "    n = len(xs)\n    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n"]},
    {"name": "clamp",
     "source": "def f(x, lo, hi):\n    return max(x, min(lo, hi))\n",
     "tests": "self.assertEqual(f(5, 0, 3), 3)\n        self.assertEqual(f(-1, 0, 3), 0)",
     "buggy": "    return max(x, min(lo, hi))\n",
     "patches": ["    return max(x, min(lo, hi))\n", "    return min(x, hi)\n", "    return max(lo, min(x, hi))\n"]},
    {"name": "mean",
     "source": "def f(xs):\n    return sum(xs) / len(xs)\n",
     "tests": "self.assertEqual(f([1, 2, 3]), 2)\n        self.assertEqual(f([]), 0)",
     "buggy": "    return sum(xs) / len(xs)\n",
     "patches": ["    return sum(xs) / len(xs)\n", "    return sum(xs) / (len(xs) or 1)\n"]},
]


def setup(sbx, seed, options):
    """The task comes in ``options``: write its module and tests; the failing run is the prompt."""
    task = options["task"]
    sbx.files.write(f"{REPO}/task.py", task["source"])
    sbx.files.write(f"{REPO}/test_task.py", "import unittest\nfrom task import f\n\n\n"
                    "class T(unittest.TestCase):\n    def test(self):\n        " + task["tests"] + "\n")
    run = sbx.commands.run(TEST + "; true", cwd=REPO)
    return {"type": "prompt", "task": task["name"], "test_output": run.stdout}


def reward(env, action, obs):
    """1 when the task's tests pass; the episode ends with the test run."""
    if not isinstance(action, Command):
        return 0.0
    return (1.0 if obs["ok"] and re.search(r"\nOK", obs["stdout"]) else 0.0), True


class Policy:
    """A softmax over each task's patches (a model would generate them from the prompt)."""

    def __init__(self, lr=1.0, seed=0):
        self.logits, self.lr, self.rng = {}, lr, random.Random(seed)

    def probs(self, task):
        logits = self.logits.setdefault(task["name"], [0.0] * len(task["patches"]))
        z = [math.exp(x - max(logits)) for x in logits]
        return [x / sum(z) for x in z]

    def sample(self, task, n):
        return self.rng.choices(range(len(task["patches"])), weights=self.probs(task), k=n)

    def update(self, task, picks, advantages):
        p, logits = self.probs(task), self.logits[task["name"]]
        for k, a in zip(picks, advantages):
            for j in range(len(logits)):
                logits[j] += self.lr * a * ((j == k) - p[j]) / len(picks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--template", default="base", help="a template with python3")
    ap.add_argument("--batch", type=int, default=3, help="tasks per iteration (one env each)")
    ap.add_argument("--group", type=int, default=8, help="continuations per task")
    ap.add_argument("--iterations", type=int, default=2)
    a = ap.parse_args()

    policy = Policy()
    tasks = itertools.cycle({"task": t} for t in DATASET)  # a dataset loader would go here
    vec = SandboxVectorEnv([lambda: SandboxEnv(a.template, setup=setup, reward_fn=reward, workdir=REPO,
                                               max_steps=4) for _ in range(a.batch)],
                           autoreset_mode="disabled", task_sampler=tasks)
    rollouts, t_start = 0, time.monotonic()
    try:
        for it in range(a.iterations):
            t0 = time.monotonic()
            prompts, _ = vec.reset(seed=it)  # each env draws its task from the sampler
            for env, prompt in zip(vec.envs, prompts):
                task = next(t for t in DATASET if t["name"] == prompt["task"])
                group = env.fork_group(a.group)
                try:
                    picks = policy.sample(task, a.group)
                    group.step([EditFile("task.py", task["buggy"], task["patches"][k]) for k in picks])
                    obs, rewards, _, _, _ = group.step([Command(TEST, timeout=60)] * a.group)
                finally:
                    group.close()
                failed = [o.get("cause") for o in obs if not o["ok"] and o.get("cause") != "exit"]
                mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
                policy.update(task, picks, [(r - mean) / (std + 1e-6) for r in rewards])
                rollouts += a.group
                print(f"iteration {it} task {task['name']}: mean reward {mean:.2f}, "
                      f"p(right patch) {policy.probs(task)[-1]:.2f}" + (f", sandbox failures {failed}" if failed else ""))
            print(f"iteration {it}: {time.monotonic() - t0:.2f} s")
    finally:
        vec.close()
    print(f"{rollouts} rollouts in {time.monotonic() - t_start:.1f} s: "
          f"{rollouts / (time.monotonic() - t_start):.2f} rollouts/s")


if __name__ == "__main__":
    main()
