import time
import unittest
import uuid

from agentenv import (AuthenticationException, NotFoundException, Sandbox, SandboxException, SandboxInfo,
                      SandboxNotFoundException, SandboxQuery, SandboxState)

from .support import TEMPLATE, SandboxTest


class SandboxTests(SandboxTest):
    def test_create_metadata_envs_info_list(self):
        tag = uuid.uuid4().hex
        sbx = self.new_sandbox(timeout=120, metadata={"test": tag}, envs={"GREETING": "hi there"})
        self.assertTrue(sbx.sandbox_id)
        self.assertEqual(sbx.commands.run("echo $GREETING").stdout, "hi there\n")
        info = sbx.get_info()
        self.assertIsInstance(info, SandboxInfo)
        self.assertEqual(info.sandbox_id, sbx.sandbox_id)
        self.assertEqual(info.template_id, TEMPLATE)
        self.assertEqual(info.metadata, {"test": tag})
        self.assertEqual(info.state, SandboxState.RUNNING)
        left = (info.end_at - info.started_at).total_seconds()
        self.assertAlmostEqual(left, 120, delta=5)
        # Also the class variant, as E2B's Sandbox.get_info(sandbox_id).
        self.assertEqual(Sandbox.get_info(sbx.sandbox_id).sandbox_id, sbx.sandbox_id)

        found = list(Sandbox.list(query=SandboxQuery(metadata={"test": tag})))
        self.assertEqual([s.sandbox_id for s in found], [sbx.sandbox_id])
        self.assertIn(sbx.sandbox_id, [s.sandbox_id for s in Sandbox.list().next_items()])

    def test_set_timeout(self):
        sbx = self.new_sandbox(timeout=60)
        sbx.set_timeout(600)
        info = sbx.get_info()
        self.assertGreater((info.end_at - info.started_at).total_seconds(), 500)
        Sandbox.set_timeout(sbx.sandbox_id, 300)
        info = sbx.get_info()
        self.assertLess((info.end_at - info.started_at).total_seconds(), 400)

    def test_context_manager_kills(self):
        with Sandbox.create(TEMPLATE) as sbx:
            self.assertTrue(sbx.is_running())
            sid = sbx.sandbox_id
        with self.assertRaises(SandboxNotFoundException):
            Sandbox.get_info(sid)
        self.assertFalse(Sandbox.kill(sid))

    def test_connect_and_kill(self):
        sbx = self.new_sandbox()
        sbx.files.write("/tmp/mark", "here")
        same = Sandbox.connect(sbx.sandbox_id)
        self.assertEqual(same.files.read("/tmp/mark"), "here")
        self.assertTrue(same.kill())
        self.assertFalse(sbx.kill())
        self.assertFalse(sbx.is_running())

    def test_pause_and_connect_resumes(self):
        sbx = self.new_sandbox()
        sbx.commands.run("echo before > /tmp/state")
        self.assertTrue(sbx.pause())
        self.assertEqual(sbx.get_info().state, "paused")
        self.assertFalse(sbx.pause())  # already paused
        paused = list(Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])))
        self.assertIn(sbx.sandbox_id, [s.sandbox_id for s in paused])
        resumed = Sandbox.connect(sbx.sandbox_id)
        self.assertEqual(resumed.get_info().state, "running")
        self.assertEqual(resumed.commands.run("cat /tmp/state").stdout, "before\n")
        sbx.pause()
        self.assertIs(sbx.connect(), sbx)  # the instance variant resumes too
        self.assertEqual(sbx.commands.run("cat /tmp/state").stdout, "before\n")

    def test_unknown_sandbox(self):
        with self.assertRaises(SandboxNotFoundException) as cm:
            Sandbox.connect("no-such-sandbox")
        self.assertIsInstance(cm.exception, NotFoundException)
        self.assertEqual(cm.exception.status_code, 404)
        self.assertIn("no-such-sandbox", str(cm.exception))
        with self.assertRaises(NotFoundException):
            Sandbox.get_info("no-such-sandbox")
        self.assertFalse(Sandbox.kill("no-such-sandbox"))

    def test_bad_api_key(self):
        with self.assertRaises(AuthenticationException) as cm:
            Sandbox.create(TEMPLATE, api_key="wrong-key")
        self.assertEqual(cm.exception.status_code, 401)
        self.assertNotIsInstance(cm.exception, SandboxException)  # as in E2B
        self.assertIn("API key", str(cm.exception))
        with self.assertRaises(AuthenticationException):
            list(Sandbox.list(api_key="wrong-key"))

    def test_unknown_template(self):
        with self.assertRaises(NotFoundException) as cm:
            Sandbox.create("no-such-template-" + uuid.uuid4().hex[:6])
        self.assertIn("no-such-template", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
