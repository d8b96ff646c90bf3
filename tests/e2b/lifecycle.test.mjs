// E2B's sandbox lifecycle through the official e2b JS SDK: the `lifecycle`
// create option (pause at the timeout, auto-resume by traffic), setTimeout(0),
// isRunning() of a paused sandbox (false, from the proxy's 502), connect()
// resuming with memory intact, and pause({ keepMemory: false }) (a resume
// boots the sandbox again with its files). Run by the Go test
// TestE2BLifecycle with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  // Without these the SDK would talk to the public e2b.app service.
  if (!process.env[k]) throw new Error(`lifecycle.test.mjs: set ${k} (see sdk.test.mjs)`)
}

const TEMPLATE = 'busybox'
const T = { timeout: 90_000 }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const created = new Set()
after(async () => {
  await Promise.allSettled([...created].map((id) => Sandbox.kill(id)))
})

async function createSandbox(opts) {
  const sbx = await Sandbox.create(TEMPLATE, opts)
  created.add(sbx.sandboxId)
  return sbx
}

async function waitPaused(sbx) {
  const deadline = Date.now() + 60_000
  while (Date.now() < deadline) {
    if ((await sbx.getInfo()).state === 'paused') return
    await sleep(100)
  }
  assert.fail(`sandbox ${sbx.sandboxId} was not paused 60 s after its timeout`)
}

// A process that holds a value only in memory: it answers it on port 9000.
async function startMemoryServer(sbx) {
  const v = `mem-${Math.random().toString(16).slice(2)}`
  await sbx.commands.run(`(while true; do echo ${v} | nc -l -p 9000; done) >/dev/null 2>&1 </dev/null &`)
  assert.equal(await askMemoryServer(sbx), v)
  return v
}

async function askMemoryServer(sbx) {
  const r = await sbx.commands.run(
    'for i in $(seq 1 300); do out=$(nc 127.0.0.1 9000 </dev/null 2>/dev/null) && [ -n "$out" ] && { echo "$out"; exit 0; }; sleep 0.1; done; exit 1',
  )
  return r.stdout.trim()
}

describe('lifecycle', { concurrency: true }, () => {
  // The short timeouts below are set once a test's setup is done: counted
  // from create, a loaded host could reach them during the setup, or
  // before the checks after an auto-resume (which gives the create
  // timeout again).
  test('onTimeout pause: paused at the timeout, isRunning false, connect resumes with memory', T, async () => {
    const sbx = await createSandbox({ timeoutMs: 120_000, lifecycle: { onTimeout: 'pause' } })
    const v = await startMemoryServer(sbx)
    await sbx.setTimeout(2_000)
    await waitPaused(sbx)
    assert.equal(await sbx.isRunning(), false, 'a paused sandbox is not running')
    const info = await sbx.getInfo()
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: false })
    const listed = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), 'listed as paused')
    await sbx.connect({ timeoutMs: 60_000 })
    assert.equal(await sbx.isRunning(), true)
    assert.equal(await askMemoryServer(sbx), v, 'memory kept across the timeout pause')
  })

  test('autoResume: traffic resumes a sandbox paused at its timeout', T, async () => {
    const sbx = await createSandbox({ timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    await sbx.files.write('/tmp/f', 'kept')
    await sbx.setTimeout(2_000)
    await waitPaused(sbx)
    // Any request through the proxy resumes it; isRunning is one.
    assert.equal(await sbx.isRunning(), true)
    assert.equal(await sbx.files.read('/tmp/f'), 'kept')
    assert.equal((await sbx.getInfo()).state, 'running')
  })

  test('onTimeout kill (the default): gone at the timeout', T, async () => {
    const sbx = await createSandbox({ timeoutMs: 2_000 })
    for (const end = Date.now() + 60_000; Date.now() < end && (await sbx.isRunning()); ) await sleep(100)
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.getInfo(), (err) => err.name === 'SandboxNotFoundError')
  })

  // E2B's spec has minimum 0 for the timeout: setTimeout(0) runs the
  // timeout action now (E2B's Python tests force an auto-pause with it).
  test('setTimeout(0) kills a sandbox at once', T, async () => {
    const sbx = await createSandbox({ timeoutMs: 60_000 })
    await sbx.setTimeout(0)
    for (const end = Date.now() + 60_000; Date.now() < end && (await sbx.isRunning()); ) await sleep(100)
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.getInfo(), (err) => err.name === 'SandboxNotFoundError')
  })

  test('setTimeout(0) with onTimeout pause: paused at once, connect resumes with memory', T, async () => {
    const sbx = await createSandbox({ timeoutMs: 60_000, lifecycle: { onTimeout: 'pause' } })
    const v = await startMemoryServer(sbx)
    await sbx.setTimeout(0)
    await waitPaused(sbx)
    await sbx.connect({ timeoutMs: 60_000 })
    assert.equal(await askMemoryServer(sbx), v, 'memory kept across the pause')
  })

  test('pause({ keepMemory: false }): connect boots it again with its files', T, async () => {
    const sbx = await createSandbox({ timeoutMs: 60_000 })
    await sbx.files.write('/home/user/notes/a.txt', 'files only')
    await startMemoryServer(sbx)
    assert.equal(await sbx.pause({ keepMemory: false }), true)
    assert.equal(await sbx.isRunning(), false)
    assert.equal((await sbx.getInfo()).state, 'paused')
    await sbx.connect()
    assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'files only')
    const r = await sbx.commands.run('nc 127.0.0.1 9000 </dev/null 2>/dev/null || echo no-server')
    assert.equal(r.stdout.trim(), 'no-server', 'processes do not survive a pause without memory')
  })

  test('the SDK refuses what E2B refuses', async () => {
    await assert.rejects(
      Sandbox.create(TEMPLATE, { lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }),
      (err) => err.name === 'InvalidArgumentError',
    )
  })
})
