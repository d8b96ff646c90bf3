"""The GRPO examples: docs/python.md shows examples/grpo.py as it is, and it
runs (a group of 4, one iteration); grpo_tasks.py runs a batch of three
tasks from its dataset."""

import os
import subprocess
import sys
import unittest

from .support import need_server

SDK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(SDK))
EXAMPLES = os.path.join(ROOT, "examples")
GRPO = os.path.join(EXAMPLES, "grpo.py")
GRPO_TASKS = os.path.join(EXAMPLES, "grpo_tasks.py")
DOCS = os.path.join(ROOT, "docs", "python.md")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


class GRPOExampleTests(unittest.TestCase):
    def setUp(self):
        if not (os.path.exists(GRPO) and os.path.exists(DOCS)):
            self.skipTest("not in the agentenv repository")

    def test_docs_show_it_as_it_is(self):
        src = _read(GRPO)
        code = src[src.index("import argparse"):]
        self.assertIn("```python\n" + code + "```", _read(DOCS),
                      "docs/python.md's RL example differs from examples/grpo.py: copy it over")

    def _template(self):
        sys.path.insert(0, EXAMPLES)
        try:
            import python_template
        finally:
            sys.path.remove(EXAMPLES)
        return python_template.pick()  # base, else python built from this host's python3

    def _env(self):
        return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (SDK, os.environ.get("PYTHONPATH")) if p))

    def test_runs(self):
        need_server()
        r = subprocess.run([sys.executable, GRPO, "--template", self._template(), "--group", "4", "--iterations", "1"],
                           capture_output=True, text=True, timeout=600, env=self._env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"iteration 0: mean reward [0-9.]+, solved \d/4")

    def test_dataset_tasks_run(self):
        # Each env of the batch draws its own task from the sampler.
        need_server()
        r = subprocess.run([sys.executable, GRPO_TASKS, "--template", self._template(), "--batch", "3", "--group", "2",
                            "--iterations", "1"], capture_output=True, text=True, timeout=600, env=self._env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for name in ("median", "clamp", "mean"):
            self.assertRegex(r.stdout, rf"iteration 0 task {name}: mean reward [0-9.]+")
        self.assertIn("rollouts/s", r.stdout)


if __name__ == "__main__":
    unittest.main()
