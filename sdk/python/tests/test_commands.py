import threading
import time
import unittest

from agentenv import CommandExitException, CommandResult, SandboxException, TimeoutException

from .support import SandboxTest


class CommandTests(SandboxTest):
    def setUp(self):
        self.sbx = self.new_sandbox()

    def test_run_result(self):
        r = self.sbx.commands.run("echo out; echo err >&2")
        self.assertIsInstance(r, CommandResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 0))

    def test_exit_exception_fields(self):
        with self.assertRaises(CommandExitException) as cm:
            self.sbx.commands.run("echo partial; echo broken >&2; exit 3")
        e = cm.exception
        self.assertIsInstance(e, SandboxException)
        self.assertIsInstance(e, CommandResult)
        self.assertEqual(e.exit_code, 3)
        self.assertEqual(e.stdout, "partial\n")
        self.assertEqual(e.stderr, "broken\n")
        self.assertIn("exited with code 3", str(e))

    def test_envs_cwd_user(self):
        r = self.sbx.commands.run("echo $A-$B; pwd", envs={"A": "1", "B": "two"}, cwd="/tmp")
        self.assertEqual(r.stdout, "1-two\n/tmp\n")
        self.assertEqual(self.sbx.commands.run("id -u", user="root").stdout.strip(), "0")
        self.assertEqual(self.sbx.commands.run("id -u", user="user").stdout.strip(), "1000")
        self.assertEqual(self.sbx.commands.run("id -u").stdout.strip(), "1000")

    def test_streaming_callbacks(self):
        out, err, times = [], [], []
        t0 = time.monotonic()

        def on_out(s):
            out.append(s)
            times.append(time.monotonic() - t0)

        r = self.sbx.commands.run("for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.3; done",
                                  on_stdout=on_out, on_stderr=err.append)
        self.assertEqual("".join(out), "line1\nline2\nline3\n")
        self.assertEqual("".join(err), "e1\ne2\ne3\n")
        self.assertEqual(r.stdout, "line1\nline2\nline3\n")
        # Streamed as it came, not all at the end.
        self.assertGreaterEqual(len(out), 3)
        self.assertLess(times[0], times[-1] - 0.4)

    def test_timeout(self):
        t0 = time.monotonic()
        with self.assertRaises(TimeoutException):
            self.sbx.commands.run("sleep 30", timeout=1)
        self.assertLess(time.monotonic() - t0, 15)

    def test_background_wait_and_kill(self):
        seen = []
        h = self.sbx.commands.run("echo started; sleep 0.5; echo done", background=True, on_stdout=seen.append)
        self.assertGreater(h.pid, 0)
        r = h.wait()
        self.assertEqual(r.stdout, "started\ndone\n")
        self.assertEqual("".join(seen), "started\ndone\n")

        h = self.sbx.commands.run("sleep 60", background=True)
        pids = [p.pid for p in self.sbx.commands.list()]
        self.assertIn(h.pid, pids)
        cmds = {p.pid: p for p in self.sbx.commands.list()}
        self.assertEqual(cmds[h.pid].args[-1], "sleep 60")
        self.assertTrue(h.kill())
        with self.assertRaises(CommandExitException) as cm:
            h.wait()
        self.assertNotEqual(cm.exception.exit_code, 0)
        self.assertNotIn(h.pid, [p.pid for p in self.sbx.commands.list()])
        self.assertFalse(self.sbx.commands.kill(h.pid))

    def test_iterate_background_handle(self):
        h = self.sbx.commands.run("echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c", background=True)
        chunks = list(h)
        self.assertEqual("".join(o for o, _, _ in chunks if o), "a\nc\n")
        self.assertEqual("".join(e for _, e, _ in chunks if e), "b\n")
        self.assertEqual(h.wait().exit_code, 0)
        self.assertEqual(list(h), chunks)  # again, from the start

    def test_commands_kill_and_connect(self):
        h = self.sbx.commands.run("i=0; while true; do i=$((i+1)); echo tick$i; sleep 0.2; done", background=True)
        got = []
        done = threading.Event()

        def on_out(s):
            got.append(s)
            if len(got) >= 2:
                done.set()

        c = self.sbx.commands.connect(h.pid, on_stdout=on_out)
        self.assertTrue(done.wait(10), "connect saw no output")
        self.assertTrue(self.sbx.commands.kill(h.pid))
        with self.assertRaises(CommandExitException):
            c.wait()
        self.assertIn("tick", "".join(got))


if __name__ == "__main__":
    unittest.main()
