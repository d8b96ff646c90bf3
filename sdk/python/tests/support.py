"""Shared helpers of the SDK's tests: they run against a real server named by
E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY (or AGENTENV_*), and skip
when none is configured (`make test` runs them through
internal/server/python_test.go)."""

import os
import unittest

from agentenv import Sandbox

TEMPLATE = os.environ.get("AGENTENV_TEMPLATE", "busybox")


def need_server() -> None:
    if not (os.environ.get("E2B_API_URL") or os.environ.get("AGENTENV_SERVER")):
        raise unittest.SkipTest("no server: set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY "
                                "(go test -run TestPythonSDK ./internal/server/ does)")


class SandboxTest(unittest.TestCase):
    """A test with one sandbox, killed at the end."""

    @classmethod
    def setUpClass(cls) -> None:
        need_server()

    def new_sandbox(self, **kw) -> Sandbox:
        sbx = Sandbox.create(kw.pop("template", TEMPLATE), **kw)
        self.addCleanup(sbx.kill)
        return sbx
