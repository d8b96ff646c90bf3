import concurrent.futures
import os
import time
import unittest

from agentenv import Sandbox

from .support import TEMPLATE, SandboxTest

N = int(os.environ.get("AGENTENV_TEST_PARALLEL", "64"))


class ThreadPoolTests(SandboxTest):
    def test_many_sandboxes_from_a_thread_pool(self):
        """One process drives N sandboxes at once from N threads."""

        def job(i):
            with Sandbox.create(TEMPLATE, metadata={"job": str(i)}) as sbx:
                sbx.files.write(f"/tmp/in{i}", f"payload-{i}")
                r = sbx.commands.run(f"cat /tmp/in{i}; echo -n :$JOB", envs={"JOB": str(i)})
                return i, r.stdout, sbx.sandbox_id

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(N) as pool:
            results = list(pool.map(job, range(N)))
        took = time.monotonic() - t0
        for i, out, _ in results:
            self.assertEqual(out, f"payload-{i}:{i}")
        self.assertEqual(len({sid for _, _, sid in results}), N)
        print(f"\n{N} sandboxes from a thread pool: {took:.1f} s ({N / took:.1f} sandboxes/s)")


if __name__ == "__main__":
    unittest.main()
