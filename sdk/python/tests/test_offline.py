"""Parts of the SDK that need no server: error mapping, configuration and
the in-tree build backend."""

import asyncio
import os
import sys
import tempfile
import unittest
import warnings
import zipfile
from unittest import mock

import agentenv
from agentenv import (AsyncSandbox, AuthenticationException, ConflictException, ConnectionConfig,
                      InvalidArgumentException, NotFoundException, RateLimitException, Sandbox, SandboxException,
                      TimeoutException)
from agentenv._transport import error_from_connect, error_from_http

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ErrorMappingTests(unittest.TestCase):
    def test_hierarchy_is_e2bs(self):
        # e2b.exceptions: every class is a SandboxException but
        # AuthenticationException, a plain Exception.
        parents = {
            "SandboxException": Exception, "TimeoutException": "SandboxException",
            "InvalidArgumentException": "SandboxException", "NotEnoughSpaceException": "SandboxException",
            "NotFoundException": "SandboxException", "FileNotFoundException": "NotFoundException",
            "SandboxNotFoundException": "NotFoundException", "AuthenticationException": Exception,
            "TemplateException": "SandboxException", "RateLimitException": "SandboxException",
            "ConflictException": "SandboxException",  # agentenv's own (HTTP 409)
        }
        for name, parent in parents.items():
            cls = getattr(agentenv, name)
            want = getattr(agentenv, parent) if isinstance(parent, str) else parent
            self.assertTrue(issubclass(cls, want), f"{name} is not a {want.__name__}")
            if want is Exception and cls is not SandboxException:
                self.assertFalse(issubclass(cls, SandboxException), f"{name} is a SandboxException")
        self.assertTrue(issubclass(agentenv.CommandExitException, SandboxException))

    def test_permission_is_not_authentication(self):
        # A user's file permission error: E2B raises a plain SandboxException.
        e = error_from_http(403, b'{"code": 403, "message": "permission denied: user \\"user\\" cannot write"}',
                            "write /etc/x")
        self.assertIs(type(e), SandboxException)
        self.assertEqual(e.status_code, 403)
        self.assertEqual(e.reason, 'permission denied: user "user" cannot write')
        e = error_from_connect({"code": "permission_denied", "message": "no"}, "filesystem.Filesystem/Remove")
        self.assertIs(type(e), SandboxException)
        self.assertEqual((e.error_code, e.reason), ("permission_denied", "no"))

    def test_rest_errors(self):
        cases = [
            (404, NotFoundException), (401, AuthenticationException), (400, InvalidArgumentException),
            (409, ConflictException), (429, RateLimitException), (502, TimeoutException), (500, SandboxException),
            (403, SandboxException),
        ]
        for status, cls in cases:
            e = error_from_http(status, b'{"code": %d, "error_code": "x", "message": "what went wrong"}' % status, "op")
            self.assertIs(type(e), cls, status)
            self.assertIn("what went wrong", str(e))
            self.assertEqual(e.status_code, status)

    def test_connect_errors(self):
        e = error_from_http(404, b'{"code": "not_found", "message": "path /x does not exist"}', "Stat")
        self.assertIsInstance(e, NotFoundException)
        self.assertEqual(e.error_code, "not_found")
        self.assertIsInstance(error_from_connect({"code": "deadline_exceeded", "message": "m"}, "Start"),
                              TimeoutException)
        self.assertIsInstance(error_from_connect({"code": "unauthenticated"}, "Start"), AuthenticationException)

    def test_not_json(self):
        e = error_from_http(503, b"upstream down", "op")
        self.assertIs(type(e), SandboxException)
        self.assertIn("upstream down", str(e))


class ForkWarningTests(unittest.TestCase):
    """fork's first argument is the children's timeout (E2B's order): a
    positional one under 10 s warns that count= was probably meant."""

    def setUp(self):
        self.bodies = []
        api = mock.patch.object(ConnectionConfig, "api", lambda _c, _m, _p, body=None, **_: self.bodies.append(body) or [])
        api.start()
        self.addCleanup(api.stop)
        self.sbx = Sandbox("sbx-1", None, ConnectionConfig(api_key="k", api_url="http://127.0.0.1:9"))

    def calls(self, fn):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn()
        return [str(x.message) for x in w], [x.filename for x in w]

    def test_positional_timeout_warns(self):
        async def fork_async():
            await AsyncSandbox(self.sbx).fork(3)

        for call in (lambda: self.sbx.fork(8), lambda: Sandbox.fork("sbx-1", 5, api_key="k"),
                     lambda: asyncio.run(fork_async())):
            msgs, files = self.calls(call)
            self.assertEqual(len(msgs), 1, msgs)
            self.assertIn("count=", msgs[0])
            self.assertEqual(files, [__file__])  # points at the caller's line
        self.assertEqual(self.bodies[0], {"count": 1, "timeout": 8})

    def test_keywords_and_long_timeouts_do_not_warn(self):
        for call in (lambda: self.sbx.fork(count=8), lambda: self.sbx.fork(timeout=5, count=2),
                     lambda: self.sbx.fork(60, 4), lambda: Sandbox.fork("sbx-1", count=3, api_key="k"),
                     lambda: asyncio.run(AsyncSandbox(self.sbx).fork(count=2))):
            self.assertEqual(self.calls(call)[0], [])
        self.assertEqual(self.bodies[0], {"count": 8, "timeout": 300})


class ConfigTests(unittest.TestCase):
    def test_precedence(self):
        env = {"E2B_API_URL": "http://e2b:1", "AGENTENV_SERVER": "http://ae:2", "AGENTENV_API_KEY": "k2"}
        with mock.patch.dict(os.environ, env, clear=True):
            c = ConnectionConfig()
            self.assertEqual((c.api_url, c.sandbox_url, c.api_key), ("http://e2b:1", "http://e2b:3001", "k2"))
            c = ConnectionConfig(api_url="http://arg:9/", sandbox_url="http://p:8", api_key="k")
            self.assertEqual((c.api_url, c.sandbox_url, c.api_key), ("http://arg:9", "http://p:8", "k"))
        with tempfile.TemporaryDirectory() as d, mock.patch.dict(
                os.environ, {"AGENTENV_SERVER": "http://ae:2", "AGENTENV_PROXY": "http://ae:5", "AGENTENV_DATA_DIR": d},
                clear=True):
            c = ConnectionConfig()
            self.assertEqual((c.api_url, c.sandbox_url, c.api_key), ("http://ae:2", "http://ae:5", None))
            with self.assertRaises(AuthenticationException):
                c.api("GET", "/sandboxes")

    def test_key_order(self):
        """AGENTENV_API_KEY, then E2B_API_KEY, then the server's key file when readable."""
        with tempfile.TemporaryDirectory() as d:
            key_file = os.path.join(d, "api-key")
            with open(key_file, "w") as f:
                f.write("from-file\n")
            cases = [({"AGENTENV_API_KEY": "ae", "E2B_API_KEY": "e2b"}, "ae"),
                     ({"E2B_API_KEY": "e2b"}, "e2b"),
                     ({}, "from-file")]
            for env, want in cases:
                with mock.patch.dict(os.environ, dict(env, AGENTENV_DATA_DIR=d), clear=True):
                    self.assertEqual(ConnectionConfig().api_key, want, env)
            if os.geteuid() != 0:  # root reads any file
                os.chmod(key_file, 0)
                with mock.patch.dict(os.environ, {"AGENTENV_DATA_DIR": d}, clear=True):
                    self.assertIsNone(ConnectionConfig().api_key)


class BuildBackendTests(unittest.TestCase):
    def test_wheel(self):
        sys.path.insert(0, HERE)
        try:
            import _build_backend
        finally:
            sys.path.remove(HERE)
        with tempfile.TemporaryDirectory() as d:
            name = _build_backend.build_wheel(d)
            with zipfile.ZipFile(os.path.join(d, name)) as z:
                names = set(z.namelist())
                self.assertIn("agentenv/__init__.py", names)
                self.assertIn("agentenv/py.typed", names)
                record = z.read("agentenv-0.1.0.dist-info/RECORD").decode()
            self.assertEqual(len(record.strip().splitlines()), len(names))
            self.assertTrue(_build_backend.build_sdist(d).endswith(".tar.gz"))



class LifecycleBodyTests(unittest.TestCase):
    """E2B's lifecycle option as the create body (what its SDK sends)."""

    def test_mapping(self):
        from agentenv.sandbox import _lifecycle_body
        cases = [
            (None, {}),
            ({"on_timeout": "kill"}, {"autoPause": False}),
            ({"on_timeout": "pause"}, {"autoPause": True}),
            ({"on_timeout": "pause", "auto_resume": True}, {"autoPause": True, "autoResume": {"enabled": True}}),
            ({"on_timeout": "pause", "auto_resume": False}, {"autoPause": True, "autoResume": {"enabled": False}}),
            ({"on_timeout": {"action": "pause", "keep_memory": False}}, {"autoPause": True, "autoPauseMemory": False}),
            ({"on_timeout": {"action": "kill"}}, {"autoPause": False}),
        ]
        for lc, want in cases:
            self.assertEqual(_lifecycle_body(lc), want, lc)
        for bad in ({"on_timeout": {"action": "kill", "keep_memory": True}}, {"auto_resume": True},
                    {"on_timeout": "stop"}):
            with self.assertRaises(InvalidArgumentException, msg=bad):
                _lifecycle_body(bad)


if __name__ == "__main__":
    unittest.main()
