"""Parallel rollouts: N sandboxes each try to fix a bug in a small Python
repository, run its unittest suite, and report a reward.

Each rollout is one episode of ``agentenv.rl.SandboxEnv``: reset (a fresh
sandbox with the repository copied in), one edit (the policy's patch), one
command (the test suite), reward = fraction of tests passed.

    python3 parallel_rollouts.py --rollouts 256 --parallel 32

Needs a template with python3 (default ``base``, the Debian template ``make
demo`` builds; without it, ``python``, built from this host's python3 by
python_template.py) and the server in E2B_API_URL /
E2B_SANDBOX_URL / E2B_API_KEY (or AGENTENV_SERVER / AGENTENV_PROXY /
AGENTENV_API_KEY).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import python_template  # noqa: E402
from agentenv.rl import Command, EditFile, SandboxEnv  # noqa: E402
from bugfix_task import BUGGY, PATCHES, REPO, REPO_DIR, TEST_COMMAND, unittest_reward  # noqa: E402


def copy_repo(sbx, seed):
    for path, text in REPO.items():
        sbx.files.write(f"{REPO_DIR}/{path}", text)


def reward(env, action, obs):
    if not isinstance(action, Command):
        return 0.0
    r = unittest_reward(obs["stdout"], obs["exit_code"])
    return r, r == 1.0


def policy(i):
    """Stands in for a model: rollout i proposes patch i mod 8."""
    return PATCHES[i % len(PATCHES)]


def rollout(i, template):
    t0 = time.monotonic()
    with SandboxEnv(template, setup=copy_repo, reward_fn=reward, max_steps=4, workdir=REPO_DIR) as env:
        _, info0 = env.reset(seed=i)
        name, body = policy(i)
        *_, info1 = env.step(EditFile("stats.py", BUGGY, body))
        obs, r, terminated, truncated, info2 = env.step(Command(TEST_COMMAND, timeout=60))
    phases = (info0["seconds"], info1["seconds"], info2["seconds"])
    return i, name, r, time.monotonic() - t0, phases


def main() -> int:
    ap = argparse.ArgumentParser(description="parallel rollouts on agentenv")
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=32, help="rollouts in flight")
    ap.add_argument("--template", help="a template with python3 (default: base, else python built from this host's)")
    a = ap.parse_args()
    a.template = python_template.pick(a.template)

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
        results = list(pool.map(lambda i: rollout(i, a.template), range(a.rollouts)))
    wall = time.monotonic() - t0

    by_patch = {}
    for _, name, r, _, _ in results:
        by_patch.setdefault(name, []).append(r)
    for name, rs in by_patch.items():
        print(f"  {name:34s} rollouts {len(rs):4d}  mean reward {statistics.mean(rs):.2f}")
    lat = sorted(r[3] for r in results)
    p95 = lat[min(len(lat) - 1, int(len(lat) * 0.95))]
    solved = sum(1 for r in results if r[2] == 1.0)
    print(f"{a.rollouts} rollouts, {a.parallel} in flight: {wall:.1f} s, {a.rollouts / wall:.1f} rollouts/s, "
          f"rollout p50 {statistics.median(lat):.2f} s p95 {p95:.2f} s, solved {solved}, "
          f"mean reward {statistics.mean(r[2] for r in results):.2f}")
    p50 = [statistics.median(r[4][k] for r in results) for k in range(3)]
    print(f"  phase p50: reset (create + copy repo) {p50[0]:.2f} s, edit {p50[1]:.2f} s, "
          f"unittest run {p50[2]:.2f} s; close (kill) is the rest")
    return 0 if solved else 1


if __name__ == "__main__":
    sys.exit(main())
