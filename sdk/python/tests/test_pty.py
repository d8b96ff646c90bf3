"""Terminals (``sbx.pty``) against a real sandbox, as E2B's SDK drives them."""

import asyncio
import threading
import time
import unittest

from agentenv import AsyncSandbox, CommandExitException, InvalidArgumentException, PtySize

from .support import TEMPLATE, SandboxTest, need_server


class Output:
    """Collects a terminal's bytes; wait_for blocks until a text shows up."""

    def __init__(self):
        self.data = b""
        self.cond = threading.Condition()

    def __call__(self, b: bytes) -> None:
        with self.cond:
            self.data += b
            self.cond.notify_all()

    def wait_for(self, text: str, within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        with self.cond:
            while text.encode() not in self.data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{text!r} not in the terminal's output: {self.data[-400:]!r}")
                self.cond.wait(left)


class PtyTests(SandboxTest):
    def test_create_input_resize_connect_kill(self):
        sbx = self.new_sandbox()
        out = Output()
        h = sbx.pty.create(PtySize(rows=30, cols=100), on_data=out, envs={"MARK": "m1"}, timeout=60)
        self.assertGreater(h.pid, 0)
        sbx.pty.send_stdin(h.pid, b"stty size; echo $TERM-$MARK\n")
        out.wait_for("30 100")
        out.wait_for("xterm-256color-m1")
        sbx.pty.resize(h.pid, PtySize(rows=50, cols=120))
        sbx.pty.send_stdin(h.pid, "stty size\n")
        out.wait_for("50 120")

        again = Output()
        h2 = sbx.pty.connect(h.pid, on_data=again)
        self.assertEqual(h2.pid, h.pid)
        sbx.pty.send_stdin(h.pid, b"echo re$((1+1))connected\n")
        again.wait_for("re2connected")

        self.assertTrue(sbx.pty.kill(h.pid))
        with self.assertRaises(CommandExitException):
            h.wait()
        # Iteration gives the terminal's bytes as (None, None, data), from the start.
        chunks = list(h)
        self.assertTrue(all(o is None and e is None for o, e, _ in chunks))
        self.assertIn(b"50 120", b"".join(p for _, _, p in chunks if p))
        self.assertNotIn(h.pid, [p.pid for p in sbx.commands.list()])
        self.assertFalse(sbx.pty.kill(h.pid))
        with self.assertRaises(InvalidArgumentException):
            sbx.pty.create(PtySize(rows=0, cols=80))


class AsyncPtyTests(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls):
        need_server()

    async def test_async_pty(self):
        async with await AsyncSandbox.create(TEMPLATE) as sbx:
            got = bytearray()
            seen = asyncio.Event()

            async def on_data(b):
                got.extend(b)
                if b"ok-42" in got:
                    seen.set()

            h = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=on_data)
            await sbx.pty.send_stdin(h.pid, b"echo ok-$((40+2))\n")
            await asyncio.wait_for(seen.wait(), 10)
            self.assertTrue(await sbx.pty.kill(h.pid))


if __name__ == "__main__":
    unittest.main()
