"""Listing pages, pause without memory, the timeout lifecycle (pause,
auto-resume) and metrics, against a real server."""

import concurrent.futures
import datetime
import time
import unittest
import uuid

from agentenv import InvalidArgumentException, Sandbox, SandboxMetrics, SandboxQuery, SandboxState

from .support import TEMPLATE, SandboxTest


def wait_state(sbx: Sandbox, state: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if sbx.get_info().state == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"sandbox {sbx.sandbox_id} not {state} after {within} s")


class ListPagingTests(SandboxTest):
    def test_pages_see_each_sandbox_once(self):
        tag = uuid.uuid4().hex
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            made = list(pool.map(lambda _: self.new_sandbox(timeout=120, metadata={"page": tag}), range(5)))
        want = sorted(s.sandbox_id for s in made)
        query = SandboxQuery(metadata={"page": tag})

        p = Sandbox.list(query=query, limit=2)
        self.assertTrue(p.has_next)
        self.assertIsNone(p.next_token)
        pages = []
        while p.has_next:
            pages.append([s.sandbox_id for s in p.next_items()])
            self.assertEqual(p.has_next, p.next_token is not None)
        self.assertEqual([len(pg) for pg in pages], [2, 2, 1])
        self.assertEqual(sorted(sum(pages, [])), want)
        with self.assertRaises(Exception):
            p.next_items()  # no more pages

        # Newest first by default; order="asc" reverses it.
        asc = [s.sandbox_id for s in Sandbox.list(query=query, limit=2, order="asc")]
        self.assertEqual(asc, list(reversed(sum(pages, []))))

        # A paginator started from a page's token continues from there.
        first = Sandbox.list(query=query, limit=2)
        first.next_items()
        rest = [s.sandbox_id for s in Sandbox.list(query=query, limit=2, next_token=first.next_token)]
        self.assertEqual(rest, sum(pages[1:], []))

        # State and template filters as E2B sends them.
        made[0].pause()
        paused = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"page": tag},
                                                                       state=[SandboxState.PAUSED]))]
        self.assertEqual(paused, [made[0].sandbox_id])
        running = list(Sandbox.list(query=SandboxQuery(metadata={"page": tag}, state=["running"]), limit=10))
        self.assertEqual(len(running), 4)
        self.assertEqual(list(Sandbox.list(query=SandboxQuery(metadata={"page": tag}, template="no-such"))), [])
        self.assertEqual(len(list(Sandbox.list(query=SandboxQuery(metadata={"page": tag}, template=TEMPLATE)))), 5)
        now = datetime.datetime.now()  # naive: local time, as E2B's SDK reads it
        later = SandboxQuery(metadata={"page": tag}, started_after=now + datetime.timedelta(hours=1))
        self.assertEqual(list(Sandbox.list(query=later)), [])
        earlier = SandboxQuery(metadata={"page": tag}, started_after=now - datetime.timedelta(minutes=10))
        self.assertEqual(len(list(Sandbox.list(query=earlier))), 5)
        with self.assertRaises(InvalidArgumentException):
            Sandbox.list(order="sideways")


class PauseLifecycleTests(SandboxTest):
    def test_pause_without_memory_keeps_files_loses_processes(self):
        sbx = self.new_sandbox(timeout=120)
        sbx.files.write("/home/user/kept.txt", "on disk")
        h = sbx.commands.run("sleep 600", background=True)
        boot = sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
        self.assertTrue(sbx.pause(keep_memory=False))
        self.assertEqual(sbx.get_info().state, SandboxState.PAUSED)
        self.assertFalse(sbx.is_running())
        self.assertEqual(sbx.get_metrics(), [])  # nothing runs: no sample
        self.assertIs(sbx.connect(), sbx)
        self.assertEqual(sbx.files.read("/home/user/kept.txt"), "on disk")
        self.assertNotIn(h.pid, [p.pid for p in sbx.commands.list()])
        self.assertNotEqual(sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout, boot)

    def test_timeout_pause_keeps_memory(self):
        sbx = self.new_sandbox(timeout=2, lifecycle={"on_timeout": "pause"})
        self.assertEqual(sbx.get_info().lifecycle, {"on_timeout": "pause", "auto_resume": False})
        # A value held only by a process: it survives only if memory does.
        h = sbx.commands.run("v=$RANDOM$RANDOM; echo $v; while true; do sleep 1; done", background=True)
        while not h.stdout:
            time.sleep(0.05)
        wait_state(sbx, "paused")
        self.assertFalse(sbx.is_running())
        sbx.connect(timeout=60)
        self.assertTrue(sbx.is_running())
        self.assertIn(h.pid, [p.pid for p in sbx.commands.list()])
        again = sbx.commands.connect(h.pid, timeout=3)
        self.assertEqual(again.pid, h.pid)
        sbx.commands.kill(h.pid)

    def test_set_timeout_zero_pauses_now(self):
        # E2B's test_auto_pause_keeps_memory: set_timeout(0) forces the
        # timeout pause now; connect resumes the same boot.
        sbx = self.new_sandbox(timeout=120, lifecycle={"on_timeout": "pause"})
        boot = sbx.files.read("/proc/sys/kernel/random/boot_id").strip()
        sbx.set_timeout(0)
        wait_state(sbx, "paused", within=30)
        self.assertFalse(sbx.is_running())
        sbx.connect()
        self.assertEqual(sbx.files.read("/proc/sys/kernel/random/boot_id").strip(), boot)

    def test_auto_resume_on_traffic(self):
        sbx = self.new_sandbox(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
        self.assertEqual(sbx.get_info().lifecycle, {"on_timeout": "pause", "auto_resume": True})
        sbx.commands.run("echo mem > /dev/shm/mark")
        wait_state(sbx, "paused")
        # Traffic (an envd call) wakes it; /dev/shm is memory, so it was kept.
        self.assertEqual(sbx.commands.run("cat /dev/shm/mark").stdout, "mem\n")
        self.assertEqual(sbx.get_info().state, SandboxState.RUNNING)

    def test_default_lifecycle_kills_at_timeout(self):
        sbx = self.new_sandbox(timeout=60)
        self.assertEqual(sbx.get_info().lifecycle, {"on_timeout": "kill", "auto_resume": False})

    def test_bad_lifecycle(self):
        for lc in ({"on_timeout": "kill", "auto_resume": True},
                   {"on_timeout": {"action": "pause", "keep_memory": False}, "auto_resume": True},
                   {"on_timeout": "sleep"}):
            with self.assertRaises(InvalidArgumentException, msg=lc):
                Sandbox.create(TEMPLATE, lifecycle=lc)


class MetricsTests(SandboxTest):
    def test_metrics_after_busy_loop(self):
        sbx = self.new_sandbox(timeout=120)
        sbx.get_metrics()  # the next sample's CPU share starts here
        sbx.commands.run("dd if=/dev/zero of=/home/user/blob bs=1M count=8 && "
                         "end=$(( $(date +%s) + 2 )); while [ $(date +%s) -lt $end ]; do :; done")
        ms = sbx.get_metrics()
        self.assertEqual(len(ms), 1)
        m = ms[0]
        self.assertIsInstance(m, SandboxMetrics)
        self.assertGreaterEqual(m.cpu_count, 1)
        self.assertGreater(m.cpu_used_pct, 5.0)
        self.assertGreater(m.mem_total, 0)
        self.assertGreater(m.mem_used, 0)
        self.assertGreater(m.disk_total, 0)
        self.assertGreater(m.disk_used, 8 << 20)
        self.assertIsNotNone(m.timestamp)
        self.assertEqual(len(Sandbox.get_metrics(sbx.sandbox_id)), 1)


if __name__ == "__main__":
    unittest.main()
