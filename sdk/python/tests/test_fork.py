import unittest

from agentenv import InvalidArgumentException, Sandbox, SandboxNotFoundException

from .support import TEMPLATE, SandboxTest

# A process that keeps a secret only in memory (its file is gone), and
# writes it out when /tmp/go appears: proof that the process, with its
# memory, continued in the fork or the restored snapshot.
HOLDER = ("v=$(cat /tmp/secret); rm /tmp/secret; "
          "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo $v > /tmp/out")


class ForkTests(SandboxTest):
    def start_holder(self, sbx, secret):
        sbx.files.write("/tmp/secret", secret)
        sbx.commands.run("(" + HOLDER + ") >/dev/null 2>&1 </dev/null", background=True)
        sbx.commands.run("while [ -e /tmp/secret ]; do sleep 0.05; done", timeout=10)

    def release(self, sbx):
        sbx.commands.run("touch /tmp/go; while [ ! -s /tmp/out ]; do sleep 0.05; done", timeout=10)
        return sbx.files.read("/tmp/out").strip()

    def test_fork_continues_memory_and_isolates(self):
        parent = self.new_sandbox()
        self.start_holder(parent, "s3cret-fork")
        children = parent.fork(count=3)
        for c in children:
            self.assertIsInstance(c, Sandbox)  # not an exception: every child started
            self.addCleanup(c.kill)
        self.assertEqual(len({c.sandbox_id for c in children} | {parent.sandbox_id}), 4)
        for i, c in enumerate(children):
            self.assertIsInstance(c, Sandbox)
            c.files.write("/tmp/child", str(i))
        for i, c in enumerate(children):
            self.assertEqual(c.files.read("/tmp/child"), str(i))
            self.assertEqual(self.release(c), "s3cret-fork")
        self.assertFalse(parent.files.exists("/tmp/child"))
        self.assertFalse(parent.files.exists("/tmp/go"))
        self.assertEqual(self.release(parent), "s3cret-fork")

    def test_fork_class_variant_and_errors(self):
        parent = self.new_sandbox()
        parent.files.write("/tmp/f", "from parent")
        (child,) = Sandbox.fork(parent.sandbox_id, timeout=60)
        self.addCleanup(child.kill)
        self.assertEqual(child.files.read("/tmp/f"), "from parent")
        info = child.get_info()
        self.assertLess((info.end_at - info.started_at).total_seconds(), 90)
        with self.assertRaises(InvalidArgumentException):
            parent.fork(count=0)
        with self.assertRaises(SandboxNotFoundException):
            Sandbox.fork("no-such-sandbox", count=2)

    def test_snapshot_restore_delete(self):
        sbx = self.new_sandbox()
        self.start_holder(sbx, "s3cret-snap")
        snap = sbx.create_snapshot(name="py-test", metadata={"by": "test"})
        self.assertTrue(snap.snapshot_id)
        self.assertIn(snap.snapshot_id, [s.snapshot_id for s in Sandbox.list_snapshots(sbx.sandbox_id)])
        self.assertIn(snap.snapshot_id, [s.snapshot_id for s in sbx.list_snapshots().next_items()])
        restored = Sandbox.create(snap.snapshot_id)
        try:
            self.assertEqual(self.release(restored), "s3cret-snap")
        finally:
            restored.kill()
        sbx.kill()
        self.assertTrue(Sandbox.delete_snapshot(snap.snapshot_id))
        self.assertFalse(Sandbox.delete_snapshot(snap.snapshot_id))


if __name__ == "__main__":
    unittest.main()
