"""Tree search: set up once, fork into branches, try a different patch in
each, keep the best.

The root environment copies the repository in and runs the failing suite
once (the expensive part an agent would do before branching: setup, a
warm interpreter, caches). ``env.fork(n)`` then gives n environments that
continue from exactly that state; each tries one patch and runs the suite;
the best branch is kept and the others are closed.

    python3 tree_search.py --branches 8
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import python_template  # noqa: E402
from agentenv.rl import Command, EditFile, SandboxEnv  # noqa: E402
from bugfix_task import BUGGY, PATCHES, REPO, REPO_DIR, TEST_COMMAND, unittest_reward  # noqa: E402
from parallel_rollouts import copy_repo, reward  # noqa: E402


def try_patch(env, patch):
    name, body = patch
    env.step(EditFile("stats.py", BUGGY, body))
    obs, r, *_ = env.step(Command(TEST_COMMAND, timeout=60))
    return name, r


def main() -> int:
    ap = argparse.ArgumentParser(description="fork-based tree search on agentenv")
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--template", help="a template with python3 (default: base, else python built from this host's)")
    a = ap.parse_args()
    a.template = python_template.pick(a.template)

    t0 = time.monotonic()
    root = SandboxEnv(a.template, setup=copy_repo, reward_fn=reward, workdir=REPO_DIR)
    root.reset(seed=0)
    obs, base, *_ = root.step(Command(TEST_COMMAND))
    t_setup = time.monotonic() - t0

    t1 = time.monotonic()
    branches = root.fork(a.branches)
    t_fork = time.monotonic() - t1

    t2 = time.monotonic()
    patches = [PATCHES[i % len(PATCHES)] for i in range(a.branches)]
    with concurrent.futures.ThreadPoolExecutor(a.branches) as pool:
        results = list(pool.map(try_patch, branches, patches))
    t_try = time.monotonic() - t2

    t3 = time.monotonic()
    best = max(range(len(results)), key=lambda i: results[i][1])
    for i, b in enumerate(branches):
        if i != best:
            b.close()
    root.close()
    t_pick = time.monotonic() - t3

    for i, (name, r) in enumerate(results):
        print(f"  branch {i}: {name:34s} reward {r:.2f}{'  <- kept' if i == best else ''}")
    kept = branches[best]
    final = kept.sandbox.files.read(f"{REPO_DIR}/stats.py")
    print(f"setup + baseline run (reward {base:.2f}): {t_setup:.2f} s; fork x{a.branches}: {t_fork:.2f} s; "
          f"try all: {t_try:.2f} s; pick and close the rest: {t_pick:.2f} s; "
          f"fork+try+pick: {t_fork + t_try + t_pick:.2f} s")
    print(f"best branch: {best} ({results[best][0]}), reward {results[best][1]:.2f}, "
          f"sandbox {kept.sandbox.sandbox_id}, median() is now:")
    body = "def median" + final.split("def median")[1].split("\n\n")[0]
    print("".join("    " + line + "\n" for line in body.splitlines()))
    kept.close()
    return 0 if results[best][1] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
