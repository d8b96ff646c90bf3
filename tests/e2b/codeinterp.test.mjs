// E2B's code interpreter SDK (@e2b/code-interpreter 2.8.0), unchanged,
// against the template code-interpreter-v1 (its default): Sandbox.create()
// then runCode. The Go test TestE2BCodeInterpreter
// (internal/server/e2b_codeinterp_test.go) builds the template once and
// runs this file with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.

import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'

import { NotFoundError, Sandbox, TimeoutError } from '@e2b/code-interpreter'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`codeinterp.test.mjs: set ${k}`)
}
const T = { timeout: 180_000 }
const created = new Set()

describe('code interpreter', { concurrency: false }, () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create({ timeoutMs: 600_000 })
    created.add(sbx)
  })
  after(async () => {
    for (const s of created) await s.kill().catch(() => {})
  })

  test('state across calls', T, async () => {
    await sbx.runCode('x = 41')
    const e = await sbx.runCode('x + 1')
    assert.equal(e.text, '42')
    assert.equal(e.error, undefined)
    assert.ok(e.executionCount >= 2, `executionCount ${e.executionCount}`)
  })

  test('stdout and stderr: callbacks and logs', T, async () => {
    const out = []
    const err = []
    const e = await sbx.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)', {
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => err.push(m.line),
    })
    assert.deepEqual(e.logs.stdout, ['to out\n'])
    assert.deepEqual(e.logs.stderr, ['to err\n'])
    assert.deepEqual(out, ['to out\n'])
    assert.deepEqual(err, ['to err\n'])
  })

  test('an error carries name, value and traceback', T, async () => {
    let seen
    const e = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (x) => { seen = x } })
    assert.equal(e.error.name, 'ZeroDivisionError')
    assert.equal(e.error.value, 'division by zero')
    assert.match(e.error.traceback, /return 1 \/ 0/)
    assert.equal(seen.name, 'ZeroDivisionError')
  })

  test('a matplotlib chart arrives as a PNG', T, async () => {
    const e = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()')
    assert.equal(e.error, undefined, `${e.error?.name}: ${e.error?.value}`)
    const png = e.results.find((r) => r.png)
    assert.ok(png, `no PNG among results with formats ${e.results.map((r) => r.formats())}`)
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
    assert.equal(png.isMainResult, false)
  })

  test('a line plot carries its chart: type, title, labels, each line', T, async () => {
    const e = await sbx.runCode([
      'import datetime',
      'import matplotlib.pyplot as plt',
      'days = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(3)]',
      'plt.figure()',
      "plt.plot(days, [1, 4, 9], label='squares')",
      "plt.plot(days, [1, 2, 3], label='linear')",
      "plt.xlabel('Day')",
      "plt.ylabel('Size (m)')",
      "plt.title('Growth')",
      'plt.show()',
    ].join('\n'))
    assert.equal(e.error, undefined, `${e.error?.name}: ${e.error?.value}`)
    const chart = e.results[0].chart
    assert.ok(chart, `no chart among formats ${e.results[0].formats()}`)
    // The JS SDK's formats() does not list chart; the figure's PNG is there too.
    assert.ok(e.results[0].png, `no PNG beside the chart: ${e.results[0].formats()}`)
    assert.equal(chart.type, 'line')
    assert.equal(chart.title, 'Growth')
    assert.equal(chart.x_label, 'Day')
    assert.equal(chart.y_unit, 'm')
    assert.equal(chart.x_scale, 'datetime')
    assert.ok(chart.y_ticks.length > 0 && chart.y_ticks.every((t) => typeof t === 'number'))
    assert.deepEqual(chart.elements.map((l) => l.label), ['squares', 'linear'])
    const pts = chart.elements[0].points
    assert.deepEqual(pts.map((p) => p[1]), [1, 4, 9])
    assert.equal(new Date(pts[0][0]).toISOString(), '2024-01-01T00:00:00.000Z')
  })

  test('a bar chart carries its bars', T, async () => {
    const e = await sbx.runCode([
      'import matplotlib.pyplot as plt',
      'plt.figure()',
      "plt.bar(['A', 'B', 'C'], [100, 200, 300], label='Sold')",
      "plt.title('Sales')",
      'plt.show()',
    ].join('\n'))
    const chart = e.results[0].chart
    assert.ok(chart, `no chart among formats ${e.results[0].formats()}`)
    assert.equal(chart.type, 'bar')
    assert.equal(chart.title, 'Sales')
    assert.equal(chart.x_unit, null)
    assert.deepEqual(chart.elements.map((b) => [b.label, b.value, b.group]),
      [['A', 100, 'Sold'], ['B', 200, 'Sold'], ['C', 300, 'Sold']])
  })

  test("a DataFrame's HTML and data", T, async () => {
    const e = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
    const r = e.results.find((x) => x.isMainResult)
    assert.ok(r, 'no main result')
    assert.match(r.html, /<table[^>]*class="dataframe"/)
    assert.deepEqual(r.data, { a: [1, 2], b: ['x', 'y'] })
    assert.ok(r.formats().includes('html'))
  })

  test('env vars of one cell', T, async () => {
    const e = await sbx.runCode('import os\nos.environ["CELL_VAR"]', { envs: { CELL_VAR: 'only-here' } })
    assert.equal(e.text, 'only-here')
    const after = await sbx.runCode('import os\nos.environ.get("CELL_VAR", "unset")')
    assert.equal(after.text, 'unset')
  })

  test("the sandbox's envs reach the kernel", T, async () => {
    // The kernel started before the sandbox (in the template's ready
    // snapshot): it gets the create's envs before its first cell.
    const other = await Sandbox.create({ timeoutMs: 120_000, envs: { SBX_VAR: 'from-create' } })
    created.add(other)
    const e = await other.runCode('import os\nos.environ.get("SBX_VAR")')
    assert.equal(e.text, 'from-create')
    await other.kill()
  })

  test('contexts: own kernel and cwd, list, restart, remove', T, async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
    assert.equal(ctx.cwd, '/tmp')
    assert.equal(ctx.language, 'python')
    const cwd = await sbx.runCode('import os\nos.getcwd()', { context: ctx })
    assert.equal(cwd.text, '/tmp')
    const sep = await sbx.runCode("'x' in globals()", { context: ctx })
    assert.equal(sep.text, 'False', 'the default context leaks into a new one')
    await sbx.runCode('y = 5', { context: ctx })
    const list = await sbx.listCodeContexts()
    assert.ok(list.some((c) => c.id === ctx.id), 'the new context is not listed')
    await sbx.restartCodeContext(ctx)
    const gone = await sbx.runCode("'y' in globals()", { context: ctx })
    assert.equal(gone.text, 'False', 'a restart keeps the variables')
    await sbx.removeCodeContext(ctx)
    // A short request timeout: the SDK leaves its request timer running
    // when the answer is an error, which would hold node open that long.
    await assert.rejects(sbx.runCode('1', { context: ctx, requestTimeoutMs: 2_000 }), NotFoundError)
  })

  test('a timed-out cell, then the kernel still works', T, async () => {
    await assert.rejects(
      sbx.runCode('import time\nwhile True:\n    time.sleep(0.05)', { timeoutMs: 2_000 }),
      TimeoutError,
    )
    const e = await sbx.runCode('x * 2')
    assert.equal(e.text, '82')
  })

  test("a fork child continues the parent's kernel", T, async () => {
    await sbx.runCode('forked = [x, "parent"]')
    const kids = await sbx.fork({ count: 1 })
    assert.equal(kids.length, 1)
    const kid = kids[0]
    assert.ok(!(kid instanceof Error), `fork child failed: ${kid}`)
    created.add(kid)
    const e = await kid.runCode('forked.append("child"); forked')
    assert.equal(e.text, "[41, 'parent', 'child']")
    const p = await sbx.runCode('forked')
    assert.equal(p.text, "[41, 'parent']", "the child's change reached the parent")
  })

  test("a snapshot's sandbox continues the kernel", T, async () => {
    await sbx.runCode('snap = x + 100')
    const snap = await sbx.createSnapshot()
    try {
      const restored = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
      created.add(restored)
      const e = await restored.runCode('snap')
      assert.equal(e.text, '141')
      await restored.kill()
    } finally {
      await Sandbox.deleteSnapshot(snap.snapshotId)
    }
  })

  test('pause and resume keep the kernel', T, async () => {
    await sbx.runCode('kept = "before pause"')
    assert.equal(await sbx.pause(), true)
    await sbx.connect()
    const e = await sbx.runCode('kept')
    assert.equal(e.text, 'before pause')
  })

  // Not an assertion: the figure the Go test logs (runCode of a trivial
  // cell, through the proxy, 30 times).
  test('runCode p50 of a trivial cell', T, async () => {
    const ms = []
    for (let i = 0; i < 30; i++) {
      const t0 = performance.now()
      await sbx.runCode('1 + 1')
      ms.push(performance.now() - t0)
    }
    ms.sort((a, b) => a - b)
    console.log(`runCode p50 ${ms[15].toFixed(1)} ms, p90 ${ms[27].toFixed(1)} ms (30 calls)`)
  })
})
