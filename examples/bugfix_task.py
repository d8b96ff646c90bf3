"""The examples' task: a small Python repository with a bug, its unittest
suite, candidate patches (what a policy would propose) and the reward.

The bug: ``stats.median`` returns the upper middle element for lists of even
length and an IndexError for an empty list; the suite wants the mean of the
two middle elements and a ValueError.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

REPO_DIR = "/home/user/repo"

REPO: Dict[str, str] = {
    "stats.py": '''"""Small statistics helpers."""


def mean(xs):
    if not xs:
        raise ValueError("mean of an empty list")
    return sum(xs) / len(xs)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def spread(xs):
    return max(xs) - min(xs)
''',
    "tests/__init__.py": "",
    "tests/test_stats.py": '''import unittest

from stats import mean, median, spread


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_median_unsorted_even(self):
        self.assertEqual(median([10, 0]), 5)

    def test_median_empty(self):
        with self.assertRaises(ValueError):
            median([])

    def test_spread(self):
        self.assertEqual(spread([5, 1, 9]), 8)


if __name__ == "__main__":
    unittest.main()
''',
}

BUGGY = "    xs = sorted(xs)\n    return xs[len(xs) // 2]\n"

# Candidate rewrites of median's body: what different policies might try.
PATCHES: List[Tuple[str, str]] = [
    ("average the two middle elements",
     "    xs = sorted(xs)\n    n = len(xs)\n    if n % 2:\n        return xs[n // 2]\n"
     "    return (xs[n // 2 - 1] + xs[n // 2]) / 2\n"),
    ("lower middle element", "    xs = sorted(xs)\n    return xs[(len(xs) - 1) // 2]\n"),
    ("use the mean", "    return sum(xs) / len(xs)\n"),
    ("guard empty, average the middle",
     "    if not xs:\n        raise ValueError('median of an empty list')\n    xs = sorted(xs)\n    n = len(xs)\n"
     "    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n"),
    ("statistics.median", "    import statistics\n    return statistics.median(xs)\n"),
    ("forget to sort", "    n = len(xs)\n    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n"),
    ("syntax error", "    xs = sorted(xs\n    return xs[0]\n"),
    ("no change", BUGGY),
]

TEST_COMMAND = "python3 -m unittest discover -s tests -t . 2>&1"


def unittest_reward(output: str, exit_code: int) -> float:
    """Fraction of the suite's tests that passed (0 when it did not run)."""
    m = re.search(r"Ran (\d+) tests?", output)
    if not m:
        return 0.0
    ran = int(m.group(1))
    if ran == 0:
        return 0.0
    if exit_code == 0:
        return 1.0
    bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", output))
    return max(0.0, (ran - bad) / ran)
