import hashlib
import io
import os
import time
import unittest

from agentenv import (AuthenticationException, EntryInfo, FileNotFoundException, FilesystemEventType, FileType, InvalidArgumentException,
                      NotFoundException, SandboxException, WriteEntry, WriteInfo)

from .support import SandboxTest


class FileTests(SandboxTest):
    def setUp(self):
        self.sbx = self.new_sandbox()
        self.files = self.sbx.files

    def test_text_and_bytes(self):
        info = self.files.write("/home/user/dir/hello.txt", "héllo\n")
        self.assertIsInstance(info, WriteInfo)
        self.assertEqual(info.path, "/home/user/dir/hello.txt")
        self.assertEqual(info.name, "hello.txt")
        self.assertEqual(self.files.read("/home/user/dir/hello.txt"), "héllo\n")
        self.assertEqual(self.files.read("/home/user/dir/hello.txt", format="bytes"), "héllo\n".encode())
        # Relative paths are the user's home, as in E2B.
        self.files.write("rel.txt", b"\x00\x01\xff")
        self.assertEqual(self.files.read("/home/user/rel.txt", format="bytes"), b"\x00\x01\xff")
        self.files.write_files([WriteEntry("/tmp/a", "A"), WriteEntry("/tmp/b", b"B")])
        self.assertEqual(self.sbx.commands.run("cat /tmp/a /tmp/b").stdout, "AB")
        with self.assertRaises(InvalidArgumentException):
            self.files.read("/tmp/a", format="xml")

    def test_large_binary_round_trip_streamed(self):
        size = 20 << 20
        data = os.urandom(size)
        want = hashlib.sha256(data).hexdigest()
        self.files.write("/tmp/big.bin", io.BytesIO(data))  # streamed in chunks
        self.assertEqual(self.sbx.commands.run("wc -c < /tmp/big.bin").stdout.strip(), str(size))
        self.assertEqual(self.sbx.commands.run("sha256sum /tmp/big.bin").stdout.split()[0], want)
        h, n, chunks = hashlib.sha256(), 0, 0
        for chunk in self.files.read("/tmp/big.bin", format="stream"):
            h.update(chunk)
            n += len(chunk)
            chunks += 1
        self.assertEqual((n, h.hexdigest()), (size, want))
        self.assertGreater(chunks, 1)
        self.assertEqual(hashlib.sha256(self.files.read("/tmp/big.bin", format="bytes")).hexdigest(), want)

    def test_list_exists_info_dirs_rename_remove(self):
        self.assertTrue(self.files.make_dir("/tmp/d/sub"))
        self.assertFalse(self.files.make_dir("/tmp/d/sub"))
        self.files.write("/tmp/d/f.txt", "12345")
        entries = {e.name: e for e in self.files.list("/tmp/d")}
        self.assertEqual(set(entries), {"sub", "f.txt"})
        self.assertIsInstance(entries["f.txt"], EntryInfo)
        self.assertEqual(entries["f.txt"].type, FileType.FILE)
        self.assertEqual(entries["sub"].type, FileType.DIR)
        self.assertEqual(entries["f.txt"].size, 5)
        self.assertEqual(entries["f.txt"].path, "/tmp/d/f.txt")
        deep = {e.path for e in self.files.list("/tmp", depth=2)}
        self.assertIn("/tmp/d/sub", deep)

        self.assertTrue(self.files.exists("/tmp/d/f.txt"))
        self.assertFalse(self.files.exists("/tmp/d/nope"))
        info = self.files.get_info("/tmp/d/f.txt")
        self.assertEqual((info.name, info.size), ("f.txt", 5))
        self.assertIsNotNone(info.modified_time)

        moved = self.files.rename("/tmp/d/f.txt", "/tmp/d/g.txt")
        self.assertEqual(moved.path, "/tmp/d/g.txt")
        self.assertFalse(self.files.exists("/tmp/d/f.txt"))
        self.files.remove("/tmp/d")
        self.assertFalse(self.files.exists("/tmp/d"))

    def test_errors(self):
        with self.assertRaises(FileNotFoundException) as cm:
            self.files.read("/tmp/does-not-exist")
        self.assertIsInstance(cm.exception, NotFoundException)
        self.assertIn("/tmp/does-not-exist", str(cm.exception))
        with self.assertRaises(FileNotFoundException):
            self.files.get_info("/tmp/does-not-exist")
        with self.assertRaises(NotFoundException):
            self.files.list("/tmp/does-not-exist")
        # A file operation the sandbox's kernel refuses (envd acts as root,
        # as E2B's, but a /proc/sys file cannot be handed to the user): a
        # plain SandboxException, as E2B raises it; not an
        # AuthenticationException.
        with self.assertRaises(SandboxException) as cm:
            self.files.write("/proc/sys/kernel/hostname", "no", user="user")
        self.assertEqual(cm.exception.status_code, 403)
        self.assertNotIsInstance(cm.exception, AuthenticationException)

    def test_watch_dir(self):
        self.files.make_dir("/tmp/w")
        w = self.files.watch_dir("/tmp/w")
        self.files.write("/tmp/w/new.txt", "x")
        self.sbx.commands.run("rm /tmp/w/new.txt")
        events = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            events += w.get_new_events()
            types = {(e.name, e.type) for e in events}
            if ("new.txt", FilesystemEventType.REMOVE) in types:
                break
            time.sleep(0.1)
        w.stop()
        names = {e.name for e in events}
        self.assertIn("new.txt", names)
        kinds = {e.type for e in events}
        self.assertIn(FilesystemEventType.REMOVE, kinds)
        self.assertTrue(kinds & {FilesystemEventType.CREATE, FilesystemEventType.WRITE, FilesystemEventType.RENAME})

        self.assertTrue(all(e.entry is None for e in events))  # not asked for

    def test_watch_dir_include_entry(self):
        self.files.make_dir("/tmp/we")
        w = self.files.watch_dir("/tmp/we", include_entry=True)
        self.files.write("/tmp/we/e.txt", "12345", metadata={"Origin": "watch"})
        events = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(e.entry for e in events):
            events += w.get_new_events()
            time.sleep(0.1)
        w.stop()
        entries = [e.entry for e in events if e.entry]
        self.assertTrue(entries, events)
        self.assertIsInstance(entries[0], EntryInfo)
        self.assertEqual(entries[0].path, "/tmp/we/e.txt")

    def test_metadata(self):
        info = self.files.write("/home/user/m.txt", "x", metadata={"Owner": "agent-7", "step": "3"})
        self.assertEqual(info.metadata, {"owner": "agent-7", "step": "3"})  # keys lowercased, as E2B
        self.assertEqual(self.files.get_info("/home/user/m.txt").metadata, {"owner": "agent-7", "step": "3"})
        listed = {e.name: e.metadata for e in self.files.list("/home/user")}
        self.assertEqual(listed["m.txt"], {"owner": "agent-7", "step": "3"})
        # A write replaces the metadata; a write without any clears it.
        self.files.write("/home/user/m.txt", "y", metadata={"step": "4"})
        self.assertEqual(self.files.get_info("/home/user/m.txt").metadata, {"step": "4"})
        self.files.write("/home/user/m.txt", "z")
        self.assertIsNone(self.files.get_info("/home/user/m.txt").metadata)
        infos = self.files.write_files([WriteEntry("/tmp/m1", "1"), WriteEntry("/tmp/m2", "2")], metadata={"batch": "b"})
        self.assertEqual([i.metadata for i in infos], [{"batch": "b"}] * 2)
        self.assertEqual(self.files.get_info("/tmp/m2").metadata, {"batch": "b"})
        for bad in ({"k": "caf\u00e9"}, {"": "v"}, {"a b": "v"}):
            with self.assertRaises(InvalidArgumentException, msg=bad):
                self.files.write("/tmp/bad", "x", metadata=bad)


if __name__ == "__main__":
    unittest.main()
