// The official e2b SDK against a fleet API server (agentenv api): create,
// run a command, write and read a file, kill. The Go fleet test runs it
// once per API server with E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set.
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`fleet.mjs: set ${k}`)
}
const sbx = await Sandbox.create('busybox', { timeoutMs: 120_000 })
try {
  const r = await sbx.commands.run('echo fleet-$((6*7))')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout.trim(), 'fleet-42')
  await sbx.files.write('/tmp/hello.txt', 'hello from the fleet')
  assert.equal(await sbx.files.read('/tmp/hello.txt'), 'hello from the fleet')
  assert.equal(await sbx.isRunning(), true)
  const listed = await Sandbox.list().nextItems()
  assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), 'the new sandbox is listed')
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('cat /tmp/hello.txt')).stdout, 'hello from the fleet')
  // Pause: the proxies answer E2B's 502 (isRunning false); connect resumes.
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect()
  assert.equal((await sbx.commands.run('cat /tmp/hello.txt')).stdout, 'hello from the fleet')
  // Pause keeping only the files: connect boots it again on its node.
  await sbx.commands.run('sleep 1000', { background: true })
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect()
  assert.equal((await sbx.commands.run('cat /tmp/hello.txt')).stdout, 'hello from the fleet')
  const ps = await sbx.commands.run('ps')
  assert.ok(!ps.stdout.includes('sleep 1000'), 'processes are gone after a pause without memory')
} finally {
  await sbx.kill()
}

// Paused at its timeout, resumed by traffic through both proxies. The
// create timeout (which the auto-resume gives again) is long enough for the
// checks after the resume on a loaded host; the short one comes after.
const lazy = await Sandbox.create('busybox', { timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
try {
  await lazy.setTimeout(2_000)
  let state
  for (const end = Date.now() + 60_000; Date.now() < end && state !== 'paused'; ) {
    await new Promise((r) => setTimeout(r, 100))
    state = (await lazy.getInfo()).state
  }
  assert.equal(state, 'paused', 'paused at its timeout')
  assert.equal(await lazy.isRunning(), true, 'traffic resumes it')
  assert.equal((await lazy.getInfo()).state, 'running')
} finally {
  await lazy.kill()
}
console.log('fleet.mjs: ok', sbx.sandboxId)
