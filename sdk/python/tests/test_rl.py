import unittest

from agentenv import Sandbox
from agentenv.rl import Command, EditFile, Env, SandboxEnv, WriteFile

from .support import TEMPLATE, need_server


def setup(sbx, seed):
    sbx.files.write("/home/user/app/value.txt", f"seed={seed}\nanswer=41\n")


def reward(env, action, obs):
    if obs.get("type") != "command":
        return 0.0
    return (1.0, True) if "answer=42" in obs["stdout"] else 0.0


class RLTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        need_server()

    def env(self, **kw):
        e = SandboxEnv(TEMPLATE, setup=setup, reward_fn=reward, **kw)
        self.addCleanup(e.close)
        return e

    def test_episode(self):
        env = self.env(max_steps=3)
        obs, info = env.reset(seed=7)
        self.assertEqual(info["step"], 0)
        self.assertTrue(info["sandbox_id"])
        obs, r, term, trunc, info = env.step("cat app/value.txt")
        self.assertEqual(obs["exit_code"], 0)
        self.assertIn("seed=7", obs["stdout"])
        self.assertEqual((r, term, trunc), (0.0, False, False))
        obs, r, term, trunc, _ = env.step(EditFile("app/value.txt", "answer=41", "answer=42"))
        self.assertTrue(obs["ok"])
        obs, r, term, trunc, info = env.step(Command("cat value.txt", cwd="/home/user/app"))
        self.assertEqual((r, term, trunc), (1.0, True, False))
        self.assertEqual(info["step"], 3)
        obs, *_ = env.step({"type": "command", "cmd": "exit 5"})
        self.assertEqual(obs["exit_code"], 5)
        obs, *_ = env.step(EditFile("app/value.txt", "not there", "x"))
        self.assertFalse(obs["ok"])
        old = env.sandbox.sandbox_id
        env.reset(seed=8)
        self.assertNotEqual(env.sandbox.sandbox_id, old)
        self.assertFalse(Sandbox.kill(old))  # reset killed the old sandbox

    def test_truncation(self):
        env = self.env(max_steps=2)
        env.reset()
        self.assertFalse(env.step("true")[3])
        self.assertTrue(env.step("true")[3])

    def test_fork_and_snapshot(self):
        env = self.env()
        env.reset(seed=1)
        env.step(WriteFile("counter", "1"))
        kids = env.fork(3)
        for k in kids:
            self.addCleanup(k.close)
        for i, k in enumerate(kids):
            self.assertEqual(k.steps, 1)
            k.step(f"echo {i} >> counter")
        for i, k in enumerate(kids):
            self.assertEqual(k.step("cat counter")[0]["stdout"], f"1{i}\n")
        self.assertEqual(env.step("cat counter")[0]["stdout"], "1")

        snap = env.snapshot()
        self.addCleanup(Sandbox.delete_snapshot, snap)
        replay = Env.from_snapshot(snap, reward_fn=reward)
        self.addCleanup(replay.close)
        for _ in range(2):  # each reset starts again from the snapshot
            replay.reset()
            self.assertEqual(replay.step("cat counter; echo x >> counter")[0]["stdout"], "1")
        env.close()  # delete the snapshot only when no sandbox uses it
        replay.close()


if __name__ == "__main__":
    unittest.main()
