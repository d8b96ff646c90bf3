// Sandbox.list paging and filters, and getMetrics, through the official e2b
// JS SDK against a running agentenv server (run by the Go test
// TestE2BSDKListAndMetrics with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set). Every sandbox created here is killed in `after`.

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

import { Sandbox } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`list.test.mjs: set ${k} (else the SDK talks to e2b.app)`)
}

const T = { timeout: 120_000 }
const suite = `list-${randomBytes(6).toString('hex')}`
const created = new Set()

async function create(i) {
  const sbx = await Sandbox.create('busybox', { metadata: { suite, i: String(i) } })
  created.add(sbx.sandboxId)
  return sbx
}

async function kill(id) {
  await Sandbox.kill(id)
  created.delete(id)
}

after(async () => {
  for (const id of created) {
    try {
      await Sandbox.kill(id)
    } catch (err) {
      console.error(`cleanup: could not kill ${id}: ${err}`)
    }
  }
})

/** Every page of a paginator, as arrays of sandbox IDs. */
async function pages(paginator) {
  const out = []
  while (paginator.hasNext) out.push((await paginator.nextItems()).map((s) => s.sandboxId))
  return out
}

describe('Sandbox.list', { concurrency: false }, () => {
  const sbs = []

  test('pages newest first by default, oldest first with order asc', T, async () => {
    // One at a time, so their start times are in creation order.
    for (let i = 0; i < 5; i++) sbs.push(await create(i))
    const ids = sbs.map((s) => s.sandboxId)

    const desc = await pages(Sandbox.list({ query: { metadata: { suite } }, limit: 2 }))
    assert.deepEqual(desc.map((p) => p.length), [2, 2, 1], `pages: ${JSON.stringify(desc)}`)
    assert.deepEqual(desc.flat(), [...ids].reverse())

    const asc = await pages(Sandbox.list({ query: { metadata: { suite } }, limit: 2, order: 'asc' }))
    assert.deepEqual(asc.flat(), ids)

    // Without a limit: one page of them all (the default is 100).
    const all = await pages(Sandbox.list({ query: { metadata: { suite } } }))
    assert.equal(all.length, 1)
    assert.equal(all[0].length, 5)
  })

  test('a kill and a create between pages neither repeat nor skip others', T, async () => {
    const p = Sandbox.list({ query: { metadata: { suite } }, limit: 2 })
    const first = (await p.nextItems()).map((s) => s.sandboxId)
    assert.ok(p.hasNext)
    // Kill the last one listed (the token's own) and one not listed yet;
    // a new sandbox is newer than the cursor, so not in the later pages.
    const notYet = sbs[0].sandboxId
    await kill(first[1])
    await kill(notYet)
    const fresh = await create(5)
    const rest = []
    while (p.hasNext) rest.push(...(await p.nextItems()).map((s) => s.sandboxId))
    const expected = sbs.map((s) => s.sandboxId).reverse().filter((id) => !first.includes(id) && id !== notYet)
    assert.deepEqual(rest, expected)
    assert.ok(!rest.includes(fresh.sandboxId))
    sbs.splice(0, sbs.length, ...sbs.filter((s) => created.has(s.sandboxId)), fresh)
  })

  test('state, template and startedAfter filters', T, async () => {
    const [paused, ...running] = sbs
    assert.equal(await paused.pause(), true)
    const listIds = async (query) =>
      (await pages(Sandbox.list({ query: { metadata: { suite }, ...query } }))).flat().sort()

    assert.deepEqual(await listIds({ state: ['paused'] }), [paused.sandboxId])
    assert.deepEqual(await listIds({ state: ['running'] }), running.map((s) => s.sandboxId).sort())
    assert.deepEqual(await listIds({ state: ['running', 'paused'] }), sbs.map((s) => s.sandboxId).sort())
    assert.deepEqual(await listIds({ template: 'busybox' }), sbs.map((s) => s.sandboxId).sort())
    assert.deepEqual(await listIds({ template: `no-such-${suite}` }), [])

    const infos = await Promise.all(sbs.map((s) => s.getInfo()))
    infos.sort((a, b) => a.startedAt - b.startedAt)
    const after = infos[1].startedAt
    assert.deepEqual(
      await listIds({ startedAfter: after }),
      infos.slice(1).map((i) => i.sandboxId).sort(),
    )
    const listed = (await Sandbox.list({ query: { metadata: { suite }, state: ['paused'] } }).nextItems())[0]
    assert.equal(listed.state, 'paused')
    assert.equal(listed.templateId, 'busybox')
  })
})

describe('getMetrics', () => {
  test('a sample in E2B shape from the sandbox cgroups', T, async () => {
    const sbx = await create(9)
    // 32 MiB into the write layer (on disk) and 32 MiB into /dev/shm (memory).
    const before = (await sbx.getMetrics())[0]
    await sbx.commands.run('dd if=/dev/urandom of=/home/user/fill bs=1M count=32 2>/dev/null; sync; dd if=/dev/urandom of=/dev/shm/fill bs=1M count=32 2>/dev/null')
    const metrics = await sbx.getMetrics()
    assert.equal(metrics.length, 1)
    const m = metrics[0]
    assert.ok(m.timestamp instanceof Date && Math.abs(Date.now() - m.timestamp.getTime()) < 60_000, `timestamp ${m.timestamp}`)
    assert.ok(m.cpuCount >= 1, `cpuCount ${m.cpuCount}`)
    assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
    assert.ok(m.memTotal > 0 && m.memUsed > 0 && m.memUsed <= m.memTotal, `mem ${m.memUsed}/${m.memTotal}`)
    assert.ok(m.memUsed - before.memUsed >= 24 << 20, `memUsed grew ${m.memUsed - before.memUsed} bytes after writing 32 MiB to /dev/shm, want ≥ 24 MiB`)
    assert.ok(m.diskUsed - before.diskUsed >= 24 << 20, `diskUsed grew ${m.diskUsed - before.diskUsed} bytes after writing 32 MiB, want ≥ 24 MiB`)
    assert.ok(m.diskUsed > 0 && m.diskTotal >= m.diskUsed, `disk ${m.diskUsed}/${m.diskTotal}`)

    const stat = await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(Date.now() - 60_000) })
    assert.equal(stat.length, 1)
    const past = await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(0), end: new Date(1000) })
    assert.deepEqual(past, [])
  })
})
