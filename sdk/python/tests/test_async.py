import asyncio
import unittest
import uuid

from agentenv import AsyncSandbox, CommandExitException, NotFoundException, SandboxNotFoundException, SandboxQuery

from .support import TEMPLATE, need_server


class AsyncTests(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls):
        need_server()

    async def test_async_api(self):
        async with await AsyncSandbox.create(TEMPLATE, metadata={"async": "1"}) as sbx:
            chunks = []

            async def on_out(s):
                chunks.append(s)

            r = await sbx.commands.run("echo a; sleep 0.2; echo b", on_stdout=on_out)
            self.assertEqual(r.stdout, "a\nb\n")
            self.assertEqual("".join(chunks), "a\nb\n")
            with self.assertRaises(CommandExitException) as cm:
                await sbx.commands.run("exit 7")
            self.assertEqual(cm.exception.exit_code, 7)

            await sbx.files.write("/tmp/x.txt", "async data")
            self.assertEqual(await sbx.files.read("/tmp/x.txt"), "async data")
            self.assertTrue(await sbx.files.exists("/tmp/x.txt"))
            self.assertIn("x.txt", [e.name for e in await sbx.files.list("/tmp")])

            events = []
            await sbx.files.make_dir("/tmp/aw")
            w = await sbx.files.watch_dir("/tmp/aw", on_event=events.append)
            await sbx.files.write("/tmp/aw/f", "1")
            for _ in range(50):
                if "f" in [e.name for e in events]:
                    break
                await asyncio.sleep(0.1)
            await w.stop()
            self.assertIn("f", [e.name for e in events])

            h = await sbx.commands.run("echo one; sleep 0.1; echo two", background=True)
            self.assertEqual("".join([o async for o, _, _ in h if o]), "one\ntwo\n")

            h = await sbx.commands.run("sleep 30", background=True)
            self.assertIn(h.pid, [p.pid for p in await sbx.commands.list()])
            self.assertTrue(await h.kill())

            info = await sbx.get_info()
            self.assertEqual(info.metadata, {"async": "1"})
            await sbx.set_timeout(200)
            again = await AsyncSandbox.connect(sbx.sandbox_id)
            self.assertEqual(await again.files.read("/tmp/x.txt"), "async data")

            kids = await sbx.fork(count=2)
            try:
                outs = await asyncio.gather(*(k.files.read("/tmp/x.txt") for k in kids))
                self.assertEqual(outs, ["async data"] * 2)
            finally:
                await asyncio.gather(*(k.kill() for k in kids))
            sid = sbx.sandbox_id
        with self.assertRaises(SandboxNotFoundException):
            await AsyncSandbox.connect(sid)

    async def test_gather_many(self):
        async def one(i):
            async with await AsyncSandbox.create(TEMPLATE) as s:
                return (await s.commands.run(f"echo {i}")).stdout.strip()

        self.assertEqual(await asyncio.gather(*(one(i) for i in range(8))), [str(i) for i in range(8)])

    async def test_list_pages_pause_metrics(self):
        tag = uuid.uuid4().hex
        sbxs = await asyncio.gather(*(AsyncSandbox.create(TEMPLATE, metadata={"apage": tag}) for _ in range(3)))
        try:
            p = AsyncSandbox.list(query=SandboxQuery(metadata={"apage": tag}), limit=2)
            pages = []
            while p.has_next:
                pages.append([s.sandbox_id for s in await p.next_items()])
            self.assertEqual([len(pg) for pg in pages], [2, 1])
            want = sorted(s.sandbox_id for s in sbxs)
            self.assertEqual(sorted(sum(pages, [])), want)
            got = [s.sandbox_id async for s in AsyncSandbox.list(query=SandboxQuery(metadata={"apage": tag}), limit=1)]
            self.assertEqual(sorted(got), want)

            m = await sbxs[0].get_metrics()
            self.assertGreater(m[0].mem_total, 0)
            await sbxs[0].files.write("/home/user/k", "kept")
            self.assertTrue(await sbxs[0].pause(keep_memory=False))
            self.assertFalse(await sbxs[0].is_running())
            again = await AsyncSandbox.connect(sbxs[0].sandbox_id)
            self.assertEqual(await again.files.read("/home/user/k"), "kept")
        finally:
            await asyncio.gather(*(s.kill() for s in sbxs))


if __name__ == "__main__":
    unittest.main()
