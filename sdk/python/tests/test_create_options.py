"""Create options beyond E2B's connection settings: memory_mb, cpu_count,
allow_internet_access and network reach the server (MemTotal inside the
sandbox shows the memory), in Sandbox.create and in agentenv.rl's
SandboxEnv; a keyword create does not take raises TypeError instead of
being dropped."""

import unittest
from unittest import mock

from agentenv import AsyncSandbox, InvalidArgumentException, Sandbox
from agentenv.rl import SandboxEnv
from agentenv.sandbox import _network_body, _size_body

from .support import TEMPLATE, SandboxTest


def mem_total_kib(sbx: Sandbox) -> int:
    line = sbx.commands.run("grep MemTotal /proc/meminfo").stdout
    return int(line.split()[1])


class OfflineTests(unittest.TestCase):
    """What is refused before any request (no server needed)."""

    def test_unknown_keyword_raises(self):
        with mock.patch("agentenv.config.ConnectionConfig.api") as api:
            for kw in ({"memroy_mb": 2048}, {"headers": {}}, {"cpus": 2}):
                with self.assertRaises(TypeError, msg=kw) as cm:
                    Sandbox.create("base", **kw)
                self.assertIn(repr(next(iter(kw))), str(cm.exception))
                self.assertIn("memory_mb", str(cm.exception))  # says what it takes
            with self.assertRaises(TypeError):
                SandboxEnv("base", memroy_mb=2048)
            with self.assertRaises(TypeError) as cm:
                SandboxEnv("base", timeout=5)
            self.assertIn("timeout", str(cm.exception))
            for bad in ({"memory_mb": "2048"}, {"cpu_count": 1.5}, {"network": {"allow": ["1.1.1.1"]}},
                        {"network": {"allow_out": "1.1.1.1"}}, {"network": ["1.1.1.1"]}):
                with self.assertRaises(TypeError, msg=bad):
                    Sandbox.create("base", **bad)
            with self.assertRaises(InvalidArgumentException):
                Sandbox.create("base", memory_mb=0)
            api.assert_not_called()

    def test_async_unknown_keyword_raises(self):
        import asyncio

        async def create():
            await AsyncSandbox.create("base", memroy_mb=2048)
        with self.assertRaises(TypeError):
            asyncio.run(create())

    def test_bodies(self):
        self.assertEqual(_size_body(None, None), {})
        self.assertEqual(_size_body(1024, 1), {"memoryMB": 1024, "cpuCount": 1})
        self.assertEqual(_network_body(None), {})
        self.assertEqual(_network_body({"allow_out": ["10.0.0.5"], "deny_out": ["0.0.0.0/0"],
                                        "allow_public_traffic": False}),
                         {"network": {"allowOut": ["10.0.0.5"], "denyOut": ["0.0.0.0/0"],
                                      "allowPublicTraffic": False}})

    def test_body_sent(self):
        with mock.patch("agentenv.config.ConnectionConfig.api") as api:
            api.return_value = {"sandboxID": "x", "envdAccessToken": "t"}
            Sandbox.create("base", memory_mb=2048, cpu_count=1, allow_internet_access=False,
                           network={"allow_out": ["10.0.0.5"]})
            body = api.call_args.args[2]
        self.assertEqual((body["memoryMB"], body["cpuCount"], body["allow_internet_access"], body["network"]),
                         (2048, 1, False, {"allowOut": ["10.0.0.5"]}))


class CreateOptionTests(SandboxTest):
    def test_memory_and_cpus(self):
        sbx = self.new_sandbox(memory_mb=1024, cpu_count=1)
        self.assertEqual(mem_total_kib(sbx), 1024 << 10)
        info = sbx.get_info()
        self.assertEqual((info.memory_mb, info.cpu_count), (1024, 1))
        # The server's default when none is asked for.
        self.assertEqual(mem_total_kib(self.new_sandbox()), 512 << 10)

    def test_past_the_servers_maximum_is_refused(self):
        with self.assertRaises(InvalidArgumentException) as cm:
            Sandbox.create(TEMPLATE, memory_mb=1 << 20)
        self.assertIn("memoryMB", str(cm.exception))

    def test_network(self):
        sbx = self.new_sandbox(allow_internet_access=False, network={"allow_out": ["10.0.0.5"]})
        d = sbx.connection_config.api("GET", "/sandboxes/" + sbx.sandbox_id)
        self.assertFalse(d["allowInternetAccess"])
        self.assertEqual(d["network"]["allowOut"], ["10.0.0.5"])

    def test_sandbox_env_sizes_its_sandboxes(self):
        env = SandboxEnv(TEMPLATE, memory_mb=768, cpu_count=1)
        self.addCleanup(env.close)
        env.reset()
        obs, *_ = env.step("grep MemTotal /proc/meminfo")
        self.assertTrue(obs["ok"], obs)
        self.assertEqual(int(obs["stdout"].split()[1]), 768 << 10)


if __name__ == "__main__":
    unittest.main()
