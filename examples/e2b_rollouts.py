"""The rollout of parallel_rollouts.py written with E2B's Python SDK names
only: code written for ``e2b`` moves to agentenv by changing one import.

    # from e2b import Sandbox, CommandExitException      <- with E2B's cloud
    from agentenv import Sandbox, CommandExitException    # <- with agentenv

    python3 e2b_rollouts.py --rollouts 64 --parallel 32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

# The one line that differs from the E2B version:
from agentenv import CommandExitException, Sandbox  # was: from e2b import CommandExitException, Sandbox

import python_template  # noqa: E402  (builds the template; with E2B you would use a template of yours)
from bugfix_task import BUGGY, PATCHES, REPO, REPO_DIR, TEST_COMMAND, unittest_reward  # noqa: E402


def rollout(i, template):
    name, body = PATCHES[i % len(PATCHES)]
    with Sandbox.create(template, timeout=300, metadata={"rollout": str(i)}) as sbx:
        for path, text in REPO.items():
            sbx.files.write(f"{REPO_DIR}/{path}", text)
        src = sbx.files.read(f"{REPO_DIR}/stats.py")
        sbx.files.write(f"{REPO_DIR}/stats.py", src.replace(BUGGY, body, 1))
        try:
            r = sbx.commands.run(TEST_COMMAND, cwd=REPO_DIR, timeout=60)
            out, code = r.stdout, r.exit_code
        except CommandExitException as e:  # E2B raises on a non-zero exit code
            out, code = e.stdout, e.exit_code
    return name, unittest_reward(out, code)


def main() -> int:
    ap = argparse.ArgumentParser(description="parallel rollouts with E2B's API names")
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=32)
    ap.add_argument("--template", help="a template with python3 (default: base, else python built from this host's)")
    a = ap.parse_args()
    a.template = python_template.pick(a.template)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
        results = list(pool.map(lambda i: rollout(i, a.template), range(a.rollouts)))
    wall = time.monotonic() - t0
    solved = sum(1 for _, r in results if r == 1.0)
    print(f"{a.rollouts} rollouts (E2B API names), {a.parallel} in flight: {wall:.1f} s, "
          f"{a.rollouts / wall:.1f} rollouts/s, solved {solved}")
    return 0 if solved else 1


if __name__ == "__main__":
    sys.exit(main())
