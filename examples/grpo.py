"""GRPO-shaped training loop on agentenv: groups of continuations from one
state, rewards from a unit test run in the sandbox.

Each iteration resets a sandbox with a small repository whose test fails
(the failing run is the prompt), forks it into a group of G continuations
(fork_group), applies in each a patch the policy samples, runs the tests
there, and turns the group's rewards into group-relative advantages that
update the policy. The policy is a softmax over candidate patches, standing
in for a model; it learns to prefer the patch that passes every test.

    python3 examples/grpo.py --group 16 --iterations 3 [--template base]

Needs a template with python3 (``base``: the Debian template ``make demo``
builds) and E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY set.
"""

import argparse
import math
import random
import re
import statistics
import time

from agentenv.rl import Command, EditFile, SandboxEnv

REPO = "/home/user/repo"
SOURCE = "def median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n"
TESTS = """import unittest
from stats import median


class MedianTest(unittest.TestCase):
    def test_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])
"""
TEST = "python3 -m unittest test_stats 2>&1"
BUGGY = "    return xs[len(xs) // 2]\n"
PATCHES = [  # what a model might propose; reward 1/3, 1/3, 2/3, 1
    BUGGY,
    "    return xs[(len(xs) - 1) // 2]\n",
    "    n = len(xs)\n    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n",
    "    if not xs:\n        raise ValueError('median of nothing')\n    n = len(xs)\n"
    "    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n",
]


def setup(sbx, seed, options):
    """A fresh sandbox gets the repository; the failing test run is the prompt."""
    sbx.files.write(f"{REPO}/stats.py", SOURCE)
    sbx.files.write(f"{REPO}/test_stats.py", TESTS)
    run = sbx.commands.run(TEST + "; true", cwd=REPO)
    return {"type": "prompt", "source": SOURCE, "test_output": run.stdout}


def reward(env, action, obs):
    """Fraction of the tests that passed; the episode ends with the test run."""
    if not isinstance(action, Command):
        return 0.0
    ran = re.search(r"Ran (\d+) test", obs["stdout"])
    if not ran:
        return 0.0, True
    bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", obs["stdout"]))
    return (int(ran.group(1)) - bad) / int(ran.group(1)), True


class Policy:
    """A softmax over PATCHES (a model would generate them from the prompt)."""

    def __init__(self, n, lr=0.5, seed=0):
        self.logits, self.lr, self.rng = [0.0] * n, lr, random.Random(seed)

    def probs(self):
        z = [math.exp(x - max(self.logits)) for x in self.logits]
        return [x / sum(z) for x in z]

    def sample(self, prompt, n):
        return self.rng.choices(range(len(self.logits)), weights=self.probs(), k=n)

    def update(self, picks, advantages):
        p = self.probs()
        for k, a in zip(picks, advantages):  # policy gradient of log softmax
            for j in range(len(self.logits)):
                self.logits[j] += self.lr * a * ((j == k) - p[j]) / len(picks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--template", default="base", help="a template with python3")
    ap.add_argument("--group", type=int, default=16, help="continuations per group")
    ap.add_argument("--iterations", type=int, default=3)
    a = ap.parse_args()

    policy = Policy(len(PATCHES))
    env = SandboxEnv(a.template, setup=setup, reward_fn=reward, workdir=REPO, max_steps=4)
    try:
        for it in range(a.iterations):
            t0 = time.monotonic()
            prompt, _ = env.reset(seed=it)
            t1 = time.monotonic()
            group = env.fork_group(a.group)  # G continuations of this state
            t2 = time.monotonic()
            try:
                picks = policy.sample(prompt, a.group)
                group.step([EditFile("stats.py", BUGGY, PATCHES[k]) for k in picks])
                _, rewards, terminated, _, _ = group.step([Command(TEST, timeout=60)] * a.group)
            finally:
                group.close()  # kills the G sandboxes
            mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
            policy.update(picks, [(r - mean) / (std + 1e-6) for r in rewards])
            print(f"iteration {it}: mean reward {mean:.2f}, solved {rewards.count(1.0)}/{a.group}, "
                  f"p(best patch) {policy.probs()[-1]:.2f}; reset {t1 - t0:.2f} s, "
                  f"fork_group({a.group}) {t2 - t1:.2f} s, edit + test + close {time.monotonic() - t2:.2f} s")
    finally:
        env.close()


if __name__ == "__main__":
    main()
