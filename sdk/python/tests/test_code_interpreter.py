"""The code interpreter names (agentenv.code_interpreter, E2B's
e2b_code_interpreter API) and the RL RunCode action, against a server with
the template code-interpreter-v1: internal/server/python_test.go's
TestPythonCodeInterpreter builds it and sets AGENTENV_CODE_INTERPRETER=1.
The parsing of the /execute stream runs without a server."""

import os
import unittest

from agentenv import exceptions as exc
from agentenv.code_interpreter import Chart, Execution, ExecutionError, Logs, Result, Sandbox, parse_line
from agentenv.rl import RunCode, SandboxEnv

from .support import need_server


class ParseTest(unittest.TestCase):
    def test_lines_build_an_execution(self):
        ex = Execution()
        seen = []
        for line in [b'{"type":"number_of_executions","execution_count":3}',
                     b'{"type":"stdout","text":"hi\\n","timestamp":"t"}',
                     b'{"type":"result","is_main_result":true,"text":"42","html":"<b>42</b>","extra":{"x/y":"z"}}',
                     b'{"type":"error","name":"E","value":"v","traceback":"tb"}',
                     b'{"type":"keepalive"}', b'{"type":"end_of_execution"}']:
            parse_line(ex, line, on_stdout=lambda m: seen.append(m.line))
        self.assertEqual(ex.execution_count, 3)
        self.assertEqual(ex.logs, Logs(stdout=["hi\n"], stderr=[]))
        self.assertEqual(seen, ["hi\n"])
        self.assertEqual(ex.text, "42")
        self.assertEqual(list(ex.results[0].formats()), ["html", "x/y"])
        self.assertEqual(ex.error, ExecutionError("E", "v", "tb"))
        self.assertIsInstance(ex.results[0], Result)

    def test_chart_has_attributes(self):
        ex = Execution()
        parse_line(ex, b'{"type":"result","is_main_result":false,"png":"iVBO","chart":{"type":"superchart","title":"T",'
                       b'"elements":[{"type":"line","title":"L","x_label":"x","elements":[{"label":"a","points":[[1,2]]}]},'
                       b'{"type":"bar","title":null,"elements":[{"label":"A","value":3,"group":"g"}]}]}}')
        chart = ex.results[0].chart
        self.assertIsInstance(chart, Chart)
        self.assertEqual((chart.type, chart.title, len(chart.elements)), ("superchart", "T", 2))
        line, bar = chart.elements
        self.assertEqual((line.type, line.x_label, line.elements[0].label, line.elements[0].points), ("line", "x", "a", [(1, 2)]))
        self.assertEqual((bar.elements[0].label, bar.elements[0].value, bar.elements[0].group), ("A", 3, "g"))
        self.assertEqual(chart.to_dict()["elements"][1]["type"], "bar")
        self.assertEqual(list(ex.results[0].formats()), ["png", "chart"])


@unittest.skipUnless(os.environ.get("AGENTENV_CODE_INTERPRETER") == "1",
                     "needs the template code-interpreter-v1 (TestPythonCodeInterpreter builds it)")
class CodeInterpreterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        need_server()
        cls.sbx = Sandbox.create(timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.sbx.kill()

    def test_state_output_and_errors(self):
        self.sbx.run_code("x = 41")
        out = []
        ex = self.sbx.run_code("print('p')\nx + 1", on_stdout=lambda m: out.append(m.line))
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.logs.stdout, ["p\n"])
        self.assertEqual(out, ["p\n"])
        ex = self.sbx.run_code("raise KeyError('k')")
        self.assertEqual(ex.error.name, "KeyError")
        self.assertIn("raise KeyError", ex.error.traceback)

    def test_charts(self):
        ex = self.sbx.run_code("import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
                               "plt.title('Squares')\nplt.show()")
        self.assertIsNone(ex.error)
        chart = ex.results[0].chart
        self.assertEqual((chart.type, chart.title), ("line", "Squares"))
        self.assertEqual(chart.elements[0].label, "squares")
        self.assertEqual(chart.elements[0].points, [(1, 1), (2, 4), (3, 9)])
        ex = self.sbx.run_code("plt.figure()\nplt.bar(['a', 'b'], [2, 5])\nplt.show()")
        chart = ex.results[0].chart
        self.assertEqual(chart.type, "bar")
        self.assertEqual([(b.label, b.value) for b in chart.elements], [("a", 2), ("b", 5)])

    def test_contexts(self):
        ctx = self.sbx.create_code_context(cwd="/tmp")
        self.assertEqual(self.sbx.run_code("import os; os.getcwd()", context=ctx).text, "/tmp")
        self.assertIn(ctx.id, [c.id for c in self.sbx.list_code_contexts()])
        self.sbx.remove_code_context(ctx)
        with self.assertRaises(exc.NotFoundException):
            self.sbx.run_code("1", context=ctx)

    def test_timeout_then_usable(self):
        self.sbx.run_code("t = 'kept'")
        with self.assertRaises(exc.TimeoutException):
            self.sbx.run_code("import time\nwhile True: time.sleep(0.05)", timeout=2)
        self.assertEqual(self.sbx.run_code("t").text, "kept")

    def test_run_code_action(self):
        env = SandboxEnv("code-interpreter-v1")
        self.addCleanup(env.close)
        env.reset()
        obs, *_ = env.step(RunCode("y = 6"))
        self.assertTrue(obs["ok"], obs)
        obs, *_ = env.step({"type": "run_code", "code": "print('seven')\ny * 7"})
        self.assertEqual((obs["ok"], obs["text"], obs["stdout"]), (True, "42", "seven\n"))
        obs, *_ = env.step(RunCode("1 / 0"))
        self.assertEqual((obs["ok"], obs["cause"], obs["name"]), (False, "error", "ZeroDivisionError"))
        self.assertIn("1 / 0", obs["traceback"])
