import unittest

from agentenv import Sandbox
from agentenv.rl import Command, EditFile, Env, SandboxEnv, SandboxVectorEnv, WriteFile, make_vec

from .support import TEMPLATE, need_server


def setup(sbx, seed):  # the two-argument form still works
    sbx.files.write("/home/user/app/value.txt", f"seed={seed}\nanswer=41\n")


def setup_with_options(sbx, seed, options):
    sbx.files.write("/home/user/task.txt", options["task"] if options else "none")
    return {"type": "task", "task": options["task"] if options else None, "seed": seed}


def reward(env, action, obs):
    if obs.get("type") != "command":
        return 0.0
    return (1.0, True) if "answer=42" in obs["stdout"] else 0.0


class RLTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        need_server()

    def env(self, **kw):
        e = SandboxEnv(TEMPLATE, **dict(dict(setup=setup, reward_fn=reward), **kw))
        self.addCleanup(e.close)
        return e

    def test_episode(self):
        env = self.env(max_steps=3)
        obs, info = env.reset(seed=7)
        self.assertEqual(obs, {"type": "reset", "template": TEMPLATE})
        self.assertEqual(info["step"], 0)
        self.assertTrue(info["sandbox_id"])
        obs, r, term, trunc, info = env.step("cat app/value.txt")
        self.assertEqual((obs["ok"], obs["exit_code"]), (True, 0))
        self.assertIn("seed=7", obs["stdout"])
        self.assertEqual((r, term, trunc), (0.0, False, False))
        obs, r, term, trunc, _ = env.step(EditFile("app/value.txt", "answer=41", "answer=42"))
        self.assertTrue(obs["ok"])
        obs, r, term, trunc, info = env.step(Command("cat value.txt", cwd="/home/user/app"))
        self.assertEqual((r, term, trunc), (1.0, True, False))
        self.assertEqual(info["step"], 3)
        old = env.sandbox.sandbox_id
        env.reset(seed=8)
        self.assertNotEqual(env.sandbox.sandbox_id, old)
        self.assertFalse(Sandbox.kill(old))  # reset killed the old sandbox

    def test_failures_are_observations(self):
        env = self.env(setup=None)
        env.reset()
        cases = [
            # action, observation fields wanted, words the error must have
            (WriteFile("/etc/passwd/x", "1"), {"type": "write", "path": "/etc/passwd/x"}, "not a directory"),
            (EditFile("missing.py", "a", "b"), {"type": "edit", "path": "/home/user/missing.py"}, "does not exist"),
            (WriteFile("/home/user", "x"), {"type": "write", "path": "/home/user"}, "is a directory"),
            (Command("echo early; sleep 5; echo late", timeout=1),
             {"type": "command", "stdout": "early\n", "exit_code": 124, "timed_out": True}, "timed out after 1 s"),
            ("echo out; echo err >&2; exit 3", {"stdout": "out\n", "stderr": "err\n", "exit_code": 3}, "exit code 3"),
            (Command("ls", cwd="/no/such/dir"), {"type": "command", "exit_code": None}, "does not exist"),
            ({"type": "edit", "path": "/home/user/t", "old": "x", "new": "y"}, {"type": "edit"}, "does not exist"),
        ]
        for i, (action, want, words) in enumerate(cases):
            obs, r, term, trunc, info = env.step(action)
            with self.subTest(action=action):
                self.assertIs(obs["ok"], False)
                self.assertEqual({k: obs.get(k) for k in want}, want)
                self.assertIn(words, obs["error"])
                # A short text for a user or a model: no SDK, RPC or HTTP context.
                for internal in ("process.Process", "filesystem.Filesystem", "(HTTP", "deadline_exceeded", "\n"):
                    self.assertNotIn(internal, obs["error"])
                self.assertLess(len(obs["error"]), 300)
                self.assertEqual(info["step"], i + 1)  # counted as a step
        self.assertEqual([a for a, _, _ in env.trajectory][0], WriteFile("/etc/passwd/x", "1"))
        self.assertEqual(len(env.trajectory), len(cases))
        obs, *_ = env.step("echo still here")  # the episode goes on
        self.assertEqual((obs["ok"], obs["stdout"]), (True, "still here\n"))
        self.assertNotIn("error", obs)

    def test_reset_options_and_initial_observation(self):
        env = self.env(setup=setup_with_options)
        obs, info = env.reset(seed=3, options={"task": "fix the bug"})
        self.assertEqual(obs, {"type": "task", "task": "fix the bug", "seed": 3})
        self.assertEqual(env.observation, obs)
        self.assertEqual((info["seed"], info["step"]), (3, 0))
        self.assertEqual(env.step("cat task.txt")[0]["stdout"], "fix the bug")
        obs, _ = env.reset()
        self.assertEqual(obs, {"type": "task", "task": None, "seed": None})

    def test_truncation(self):
        env = self.env(max_steps=2)
        env.reset()
        self.assertFalse(env.step("true")[3])
        self.assertTrue(env.step("true")[3])

    def test_vector_env_autoreset(self):
        vec = make_vec(2, TEMPLATE, setup=setup_with_options, max_steps=2)
        self.addCleanup(vec.close)
        obs, infos = vec.reset(seed=10, options={"task": "t"})
        self.assertEqual([o["seed"] for o in obs], [10, 11])
        self.assertEqual(infos["_sandbox_id"], [True, True])
        first = list(infos["sandbox_id"])
        obs, rewards, terms, truncs, infos = vec.step(["cat task.txt", "exit 1"])
        self.assertEqual([o["stdout"] for o in obs], ["t", ""])
        self.assertEqual([o["ok"] for o in obs], [True, False])
        self.assertEqual((rewards, terms, truncs), ([0.0, 0.0], [False, False], [False, False]))
        _, _, _, truncs, infos = vec.step(["true", "true"])
        self.assertEqual(truncs, [True, True])
        # Next-step autoreset: the actions are ignored, each starts afresh.
        obs, rewards, terms, truncs, infos = vec.step(["echo ignored", "echo ignored"])
        self.assertEqual([o["type"] for o in obs], ["task", "task"])
        self.assertEqual((rewards, terms, truncs), ([0.0, 0.0], [False, False], [False, False]))
        self.assertEqual(infos["step"], [0, 0])
        self.assertTrue(set(infos["sandbox_id"]).isdisjoint(first))
        self.assertFalse(any(Sandbox.kill(i) for i in first))  # the finished episodes' sandboxes are gone
        self.assertEqual(vec.step(["echo a", "echo b"])[0][1]["stdout"], "b\n")

        same = SandboxVectorEnv([lambda: SandboxEnv(TEMPLATE, setup=setup_with_options, max_steps=1)],
                                autoreset_mode="same_step")
        self.addCleanup(same.close)
        same.reset(seed=1)
        obs, _, _, truncs, infos = same.step(["echo last"])
        self.assertEqual((obs[0]["type"], truncs), ("task", [True]))  # already the next episode's
        self.assertEqual(infos["final_obs"][0]["stdout"], "last\n")
        self.assertEqual(infos["_final_obs"], [True])
        self.assertEqual(infos["final_info"][0]["step"], 1)

    def test_fork_group(self):
        env = self.env(setup=setup_with_options)
        env.reset(options={"task": "count"})
        env.step(WriteFile("counter", "1"))
        group = env.fork_group(3)
        self.addCleanup(group.close)
        self.assertEqual(group.num_envs, 3)
        self.assertEqual(len({e.sandbox.sandbox_id for e in group.envs} | {env.sandbox.sandbox_id}), 4)
        for member in group.envs:
            self.assertEqual((member.steps, member.observation["type"], len(member.trajectory)), (1, "write", 1))
        obs, rewards, terms, truncs, infos = group.step([f"echo {i} >> counter; cat counter" for i in range(3)])
        self.assertEqual([o["stdout"] for o in obs], ["10\n", "11\n", "12\n"])
        self.assertEqual(infos["step"], [2, 2, 2])
        self.assertEqual(env.step("cat counter")[0]["stdout"], "1")  # the parent is untouched
        ids = [e.sandbox.sandbox_id for e in group.envs]
        group.close()
        self.assertFalse(any(Sandbox.kill(i) for i in ids))

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
