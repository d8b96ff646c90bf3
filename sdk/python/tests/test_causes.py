"""Failures that name their cause, and the RL envs that turn them into
observations, against a fake API server and envd on loopback (no sandbox
needed): a stream cut in the middle makes the SDK ask the API what became
of the sandbox."""

import asyncio
import base64
import json
import socket
import struct
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentenv import (OutOfMemoryException, Sandbox, SandboxException, SandboxLostException,
                      SandboxNotFoundException, TimeoutException)
from agentenv._transport import error_from_http, gone_error
from agentenv.rl import AsyncSandboxEnv, AsyncSandboxVectorEnv, Command, SandboxEnv, SandboxVectorEnv, make_vec

# The server's words (internal/sandbox: registry.go, ended.go, kill.go).
LOST_OOM = ('sandbox "%s" was lost: it stopped unexpectedly (out of its memory limit, or its init process '
            'exited); last output: x: not found')
LOST_RESTART = 'sandbox "%s" was lost: its record was unreadable after a restart (EOF): not found'
TIMED_OUT = ('sandbox "%s" does not exist: it timed out at 2026-12-03 14:00:00 UTC (give it a longer timeout '
             'when you create it, or extend it while it runs): not found')
KILLED = 'sandbox "%s" does not exist: it was killed at 2026-12-03 14:00:00 UTC: not found'


def _envelope(msg, flags=0):
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


def _chunk(b):
    return b"%x\r\n" % len(b) + b + b"\r\n"


class FakeServer:
    """The REST API and envd behind one address. ``fate[id]`` says what
    happens to a command in sandbox id: "ok" (prints "out <id> <n>"),
    "die" (the stream is cut and the API then says ``gone[id]``), "timeout"
    (prints, then envd's deadline_exceeded)."""

    def __init__(self):
        self.fate, self.gone, self.created, self.starts = {}, {}, [], []
        self.files = {}
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    return self.rfile.read(n)
                if self.headers.get("Transfer-Encoding") == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return b""

            def _json(self, status, doc):
                raw = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                body = self._body()
                sid = self.headers.get("E2b-Sandbox-Id")
                if self.path == "/sandboxes":
                    with fake.lock:
                        sid = "sbx%d" % len(fake.created)
                        fake.created.append(sid)
                    return self._json(201, {"sandboxID": sid, "templateID": "t", "envdAccessToken": "tok"})
                if self.path.startswith("/files"):
                    fake.files.setdefault(sid, []).append(body)
                    return self._json(200, [{"name": "x", "type": "file", "path": "/x"}])
                if self.path == "/process.Process/Start":
                    return self._start(sid, json.loads(body[5:]))
                self._json(404, {"code": 404, "message": "no route " + self.path})

            def _start(self, sid, msg):
                with fake.lock:
                    fake.starts.append((sid, msg))
                    n = len(fake.starts)
                self.send_response(200)
                self.send_header("Content-Type", "application/connect+json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(_chunk(_envelope({"event": {"start": {"pid": 7}}})))
                fate = fake.fate.get(sid, "ok")
                if fate == "die":
                    # The proxy cuts the stream when the sandbox goes.
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                out = base64.b64encode(b"out %s %d" % (sid.encode(), n)).decode()
                self.wfile.write(_chunk(_envelope({"event": {"data": {"stdout": out}}})))
                if fate == "timeout":
                    end = {"error": {"code": "deadline_exceeded", "message": "the command timed out"}}
                else:
                    end = {}
                    self.wfile.write(_chunk(_envelope({"event": {"end": {"exitCode": 0, "exited": True}}})))
                self.wfile.write(_chunk(_envelope(end, flags=2)))
                self.wfile.write(b"0\r\n\r\n")

            def do_GET(self):
                sid = self.path.rsplit("/", 1)[-1]
                if self.path.startswith("/sandboxes/"):
                    if sid in fake.gone:
                        return self._json(404, {"code": 404, "error_code": "not_found",
                                                "message": fake.gone[sid] % sid})
                    return self._json(200, {"sandboxID": sid, "templateID": "t", "state": "running"})
                self._json(404, {"code": 404, "message": "no route"})

            def do_DELETE(self):
                self._body()
                sid = self.path.rsplit("/", 1)[-1]
                if sid in fake.gone:
                    return self._json(404, {"code": 404, "error_code": "not_found", "message": "gone"})
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def opts(self):
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": "k"}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class GoneErrorTests(unittest.TestCase):
    """The server's 404 for a sandbox that ended becomes the exception that says how."""

    def test_classes_and_causes(self):
        cases = [
            (LOST_OOM, OutOfMemoryException, "oom"),
            (LOST_RESTART, SandboxLostException, "lost"),
            (TIMED_OUT, TimeoutException, "sandbox_timeout"),
            (KILLED, SandboxNotFoundException, "killed"),
            ('sandbox "%s" does not exist (it may have been killed or timed out): not found',
             SandboxNotFoundException, None),
        ]
        for text, cls, cause in cases:
            nf = error_from_http(404, json.dumps({"code": 404, "error_code": "not_found",
                                                  "message": text % "s1"}).encode(), "get")
            e = gone_error(nf, "s1", "process.Process/Start")
            self.assertIs(type(e), cls, text)
            self.assertEqual(e.cause, cause, text)
            self.assertFalse(e.reason.endswith("not found"), e.reason)
        # The body's end_cause wins over the words of the message.
        for end, cls, cause in [("oom", OutOfMemoryException, "oom"), ("lost", SandboxLostException, "lost"),
                                ("timeout", TimeoutException, "sandbox_timeout"),
                                ("killed", SandboxNotFoundException, "killed")]:
            nf = error_from_http(404, json.dumps({"code": 404, "error_code": "not_found", "end_cause": end,
                                                  "message": 'sandbox "s1" does not exist: not found'}).encode(), "get")
            e = gone_error(nf, "s1", "process.Process/Start")
            self.assertIs(type(e), cls, end)
            self.assertEqual(e.cause, cause, end)
        self.assertTrue(issubclass(OutOfMemoryException, SandboxLostException))
        self.assertTrue(issubclass(SandboxLostException, SandboxNotFoundException))


class FakeServerTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeServer()
        self.addCleanup(self.fake.close)


class CauseTests(FakeServerTest):
    def sandbox(self, fate, gone=None):
        sbx = Sandbox.create("t", **self.fake.opts())
        self.fake.fate[sbx.sandbox_id] = fate
        if gone:
            self.fake.gone[sbx.sandbox_id] = gone
        return sbx

    def test_broken_stream_asks_the_server(self):
        for gone, cls, cause in [(LOST_OOM, OutOfMemoryException, "oom"), (LOST_RESTART, SandboxLostException, "lost"),
                                 (TIMED_OUT, TimeoutException, "sandbox_timeout"),
                                 (KILLED, SandboxNotFoundException, "killed")]:
            sbx = self.sandbox("die", gone)
            with self.assertRaises(cls) as cm:
                sbx.commands.run("x")
            self.assertEqual(cm.exception.cause, cause)
            self.assertIn(sbx.sandbox_id, str(cm.exception))
            self.assertNotIn("IncompleteRead", str(cm.exception))

    def test_broken_stream_of_a_running_sandbox_stays_as_it_was(self):
        sbx = self.sandbox("die")  # the API says it still runs
        with self.assertRaises(SandboxException) as cm:
            sbx.commands.run("x")
        self.assertEqual(cm.exception.error_code, "stream_broken")
        self.assertIsNone(cm.exception.cause)

    def test_command_timeout_keeps_its_output(self):
        sbx = self.sandbox("timeout")
        with self.assertRaises(TimeoutException) as cm:
            sbx.commands.run("x", timeout=1)
        self.assertEqual(cm.exception.cause, "command_timeout")
        self.assertIn("out " + sbx.sandbox_id, cm.exception.stdout)

    def test_output_cap(self):
        sbx = self.sandbox("ok")
        h = sbx.commands.run("x", background=True, max_output=5)
        h.wait()
        self.assertEqual(h.stdout, "out s")
        self.assertTrue(h.stdout_truncated)
        self.assertFalse(h.stderr_truncated)


def _setup(sbx, seed, options):
    sbx.files.write("/task", json.dumps(options))
    return {"type": "task", "task": options}


class RLFailureTests(FakeServerTest):
    def test_lost_sandbox_is_an_observation_and_reset_gives_a_new_one(self):
        env = SandboxEnv("t", **self.fake.opts())
        self.addCleanup(env.close)
        env.reset()
        first = env.sandbox.sandbox_id
        self.fake.fate[first], self.fake.gone[first] = "die", LOST_OOM
        obs, r, term, trunc, _ = env.step("python3 -c 'x=bytearray(1500<<20)'")
        self.assertFalse(obs["ok"])
        self.assertEqual(obs["cause"], "oom")
        self.assertIn("memory", obs["error"])
        self.assertTrue(trunc)
        starts = len(self.fake.starts)
        obs2, _, _, trunc2, _ = env.step("echo again")
        self.assertEqual((obs2["cause"], trunc2), ("oom", True))
        self.assertEqual(len(self.fake.starts), starts, "a step after the sandbox ended made a request")
        env.reset()
        self.assertNotEqual(env.sandbox.sandbox_id, first)
        obs3, *_ = env.step("echo ok")
        self.assertTrue(obs3["ok"], obs3)

    def test_command_timeout_observation(self):
        env = SandboxEnv("t", **self.fake.opts())
        self.addCleanup(env.close)
        env.reset()
        self.fake.fate[env.sandbox.sandbox_id] = "timeout"
        obs, *_ = env.step(Command("sleep 100", timeout=1))
        self.assertEqual((obs["ok"], obs["cause"], obs["timed_out"]), (False, "command_timeout", True))

    def test_action_is_detached_and_capped(self):
        env = SandboxEnv("t", max_output=3, **self.fake.opts())
        self.addCleanup(env.close)
        env.reset()
        obs, *_ = env.step("server &")
        sent = self.fake.starts[-1][1]["process"]["args"][-1]
        # The action's output goes to files, so a background job cannot
        # hold envd's pipes (and the step) open; the cut is made in the sandbox.
        self.assertIn('>"$__o.o" 2>"$__o.e" </dev/null', sent)
        self.assertIn("head -c 4", sent)
        self.assertIn("/tmp/.agentenv-action-", sent)
        self.assertIn("\nserver &\n", sent)
        self.assertEqual((obs["stdout"], obs["stdout_truncated"]), ("out", True))

    def test_fork_group_sized_batch_keeps_every_result(self):
        venv = make_vec(16, "t", autoreset_mode="disabled", **self.fake.opts())
        self.addCleanup(venv.close)
        venv.reset()
        dead = venv.envs[5].sandbox.sandbox_id
        self.fake.fate[dead], self.fake.gone[dead] = "die", LOST_OOM
        obs, rewards, terms, truncs, infos = venv.step(["echo hi"] * 16)
        self.assertEqual(len(obs), 16)
        failed = [i for i, o in enumerate(obs) if not o["ok"]]
        self.assertEqual(failed, [5])
        self.assertIn(obs[5]["cause"], ("oom", "lost"))
        self.assertTrue(truncs[5])

    def test_per_env_options_and_sampler_on_autoreset(self):
        tasks = iter([{"task": n} for n in range(100)])
        venv = SandboxVectorEnv([lambda: SandboxEnv("t", setup=_setup, max_steps=1, **self.fake.opts())
                                 for _ in range(3)], task_sampler=tasks)
        self.addCleanup(venv.close)
        obs, _ = venv.reset(options=[{"task": "a"}, {"task": "b"}, None])
        self.assertEqual([o["task"] for o in obs[:2]], [{"task": "a"}, {"task": "b"}])
        self.assertEqual(obs[2]["task"], {"task": 0})
        _, _, _, truncs, _ = venv.step(["true"] * 3)
        self.assertEqual(truncs, [True] * 3)
        obs, _, _, _, _ = venv.step(["true"] * 3)  # next_step: each resets with a sampled task
        self.assertEqual(sorted(o["task"]["task"] for o in obs), [1, 2, 3])

    def test_step_async_and_ready(self):
        venv = make_vec(3, "t", autoreset_mode="disabled", **self.fake.opts())
        self.addCleanup(venv.close)
        venv.reset()
        venv.step_async(["a", None, "c"])
        got = {}
        while venv.pending:
            got.update(venv.step_ready(timeout=30))
        self.assertEqual(sorted(got), [0, 2])
        with self.assertRaises(RuntimeError):
            venv.step_async(["a", None, None])
            venv.step_async(["a", None, None])
        obs, _, _, _, infos = venv.step_wait(timeout=30)
        self.assertEqual(infos["stepped"], [True, False, False])
        self.assertTrue(obs[0]["ok"])


class AsyncEnvTests(FakeServerTest):
    def test_async_env_and_vector_env(self):
        async def main():
            async with AsyncSandboxEnv("t", setup=_setup, **self.fake.opts()) as env:
                obs, _ = await env.reset(options={"task": 1})
                self.assertEqual(obs["task"], {"task": 1})
                obs, *_ = await env.step("echo")
                self.assertTrue(obs["ok"], obs)
            venv = AsyncSandboxVectorEnv([lambda: SandboxEnv("t", **self.fake.opts()) for _ in range(2)])
            async with venv:
                await venv.reset()
                obs, *_ = await venv.step(["a", "b"])
                self.assertEqual([o["ok"] for o in obs], [True, True])
                venv.step_async([None, "c"])
                ready = {}
                while len(ready) < 1:
                    ready.update(await venv.step_ready(timeout=30))
                self.assertEqual(list(ready), [1])
        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
