"""Failures against a real server: each names its cause, and in the RL envs
each is an observation (the offline half is test_causes.py)."""

import itertools
import unittest

from agentenv import (CommandExitException, Sandbox, SandboxLostException, SandboxNotFoundException,
                      TimeoutException)
from agentenv.rl import Command, SandboxEnv, SandboxVectorEnv

from .support import TEMPLATE, SandboxTest, need_server

# More than a sandbox's default 512 MiB: busybox's dd fills a buffer of bs bytes.
OOM = "dd if=/dev/zero of=/dev/null bs=1536M count=1"


def _poll(fn, tries=100):
    """fn() until it returns something true; its last value."""
    v = None
    for _ in range(tries):
        v = fn()
        if v:
            return v
    return v


class CauseTests(SandboxTest):
    def test_killed(self):
        sbx = self.new_sandbox()
        h = sbx.commands.run("sleep 60", background=True)
        Sandbox.kill(sbx.sandbox_id)
        with self.assertRaises(SandboxNotFoundException) as cm:
            h.wait()
        self.assertEqual(cm.exception.cause, "killed", cm.exception)
        with self.assertRaises(SandboxNotFoundException) as cm:
            sbx.commands.run("true")
        self.assertEqual(cm.exception.cause, "killed", cm.exception)

    def test_sandbox_timeout(self):
        sbx = self.new_sandbox()
        h = sbx.commands.run("sleep 60", background=True)
        sbx.set_timeout(1)
        with self.assertRaises(TimeoutException) as cm:
            h.wait()
        self.assertEqual(cm.exception.cause, "sandbox_timeout", cm.exception)
        self.assertIn("timed out at", str(cm.exception))

    def test_command_timeout_keeps_partial_output(self):
        sbx = self.new_sandbox()
        with self.assertRaises(TimeoutException) as cm:
            sbx.commands.run("echo started; sleep 60", timeout=1)
        self.assertEqual(cm.exception.cause, "command_timeout")
        self.assertIn("started", cm.exception.stdout)
        self.assertEqual(sbx.commands.run("echo alive").stdout.strip(), "alive")

    def test_out_of_memory(self):
        # Today the whole sandbox dies (lost, with the server's why); where
        # the kernel kills only the command, it exits 137 and the sandbox lives.
        sbx = self.new_sandbox()
        try:
            sbx.commands.run(OOM, timeout=120)
        except SandboxLostException as e:
            self.assertIn(e.cause, ("oom", "lost"))
            self.assertIn("memory", e.reason)
        except CommandExitException as e:
            self.assertIn(e.exit_code, (137, -1))
            self.assertEqual(sbx.commands.run("echo alive").stdout.strip(), "alive")
        else:
            self.fail("a 1.5 GiB allocation in a 512 MiB sandbox succeeded")


def _task_setup(sbx, seed, options):
    sbx.files.write("/home/user/task.txt", options["task"])
    return {"type": "task", "task": options["task"]}


class RLFailureTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        need_server()

    def test_fork_group_with_one_oom_child_returns_every_result(self):
        env = SandboxEnv(TEMPLATE)
        self.addCleanup(env.close)
        env.reset()
        group = env.fork_group(16)
        self.addCleanup(group.close)
        actions = ["echo ok"] * 16
        actions[3] = OOM
        obs, rewards, terms, truncs, infos = group.step(actions)
        self.assertEqual(len(obs), 16)
        self.assertFalse(obs[3]["ok"])
        self.assertTrue(obs[3]["cause"] in ("oom", "lost") or obs[3].get("exit_code") in (137, -1), obs[3])
        self.assertEqual([i for i, o in enumerate(obs) if not o["ok"]], [3], obs)
        self.assertEqual([o["stdout"].strip() for i, o in enumerate(obs) if i != 3], ["ok"] * 15)
        # The member can start again in a new sandbox.
        group.reset(options={"reset_mask": [i == 3 for i in range(16)]})
        again, *_ = group.step(["echo back"] * 16)
        self.assertEqual(again[3]["stdout"].strip(), "back", again[3])

    def test_vector_env_per_env_tasks_and_autoreset(self):
        tasks = iter(f"task-{n}" for n in itertools.count())
        venv = SandboxVectorEnv([lambda: SandboxEnv(TEMPLATE, setup=_task_setup, max_steps=1) for _ in range(2)],
                                task_sampler=lambda i, seed: {"task": next(tasks)})
        self.addCleanup(venv.close)
        obs, _ = venv.reset(options=[{"task": "first-0"}, {"task": "first-1"}])
        self.assertEqual([o["task"] for o in obs], ["first-0", "first-1"])
        obs, _, _, truncs, _ = venv.step(["cat task.txt"] * 2)
        self.assertEqual([o["stdout"] for o in obs], ["first-0", "first-1"])
        self.assertEqual(truncs, [True, True])
        obs, *_ = venv.step(["cat task.txt"] * 2)  # autoreset: a sampled task each
        self.assertEqual(sorted(o["task"] for o in obs), ["task-0", "task-1"])
        obs, *_ = venv.step(["cat task.txt"] * 2)
        self.assertEqual(sorted(o["stdout"] for o in obs), ["task-0", "task-1"])

    def test_background_job_returns_and_leaves_no_zombies(self):
        env = SandboxEnv(TEMPLATE)
        self.addCleanup(env.close)
        env.reset()
        obs, *_ = env.step(Command("sleep 300 & echo started", timeout=30))
        self.assertTrue(obs["ok"], obs)
        self.assertEqual(obs["stdout"].strip(), "started")
        obs, *_ = env.step("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | "
                           "grep -c '^sleep 300'")
        self.assertNotEqual(obs["stdout"].strip(), "0", "the background job did not outlive its action")
        obs, *_ = env.step(Command("sleep 100 & sleep 100 & sleep 100", timeout=1))
        self.assertEqual(obs["cause"], "command_timeout", obs)
        zombies = "cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"' | wc -l"
        left = _poll(lambda: env.step(zombies)[0]["stdout"].strip() == "0")
        self.assertTrue(left, "zombies left after a timed-out command")

    def test_large_output_is_capped(self):
        env = SandboxEnv(TEMPLATE, max_output=1000)
        self.addCleanup(env.close)
        env.reset()
        obs, *_ = env.step("head -c 50000000 /dev/zero | tr '\\0' x")
        self.assertTrue(obs["ok"], {k: v for k, v in obs.items() if k != "stdout"})
        self.assertEqual(len(obs["stdout"]), 1000)
        self.assertTrue(obs["stdout_truncated"])
        self.assertNotIn("stderr_truncated", obs)


if __name__ == "__main__":
    unittest.main()
