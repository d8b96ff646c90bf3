// What the official e2b SDK sees, measured against a running agentenv
// server (the SDK's rows of the benchmark table): create until a command has run, a command
// round trip, kill, rollouts/s at N in flight, and fork 16 until every
// child ran a command. Not a test: prints one JSON object.
//
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3001 \
//   E2B_API_KEY=... node sdkbench.mjs
//
// Env: TEMPLATE (busybox), N (20 samples), INFLIGHT (8), ROLLOUT_S (20),
// FORK_N (16), FORK_SAMPLES (5).
import { Sandbox } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`set ${k} (this must never reach the public e2b service)`)
}
const API = process.env.E2B_API_URL.replace(/\/+$/, '')
const KEY = process.env.E2B_API_KEY
const TEMPLATE = process.env.TEMPLATE || 'busybox'
const N = parseInt(process.env.N || '20')
const INFLIGHT = parseInt(process.env.INFLIGHT || '8')
const ROLLOUT_S = parseFloat(process.env.ROLLOUT_S || '20')
const FORK_N = parseInt(process.env.FORK_N || '16')
const FORK_SAMPLES = parseInt(process.env.FORK_SAMPLES || '5')

const now = () => performance.now()
function pct(xs, p) {
  if (!xs.length) return null
  const s = [...xs].sort((a, b) => a - b)
  return +s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)].toFixed(1)
}
const stats = (xs) => ({ n: xs.length, p50: pct(xs, 50), p95: pct(xs, 95) })

async function api(method, path, body) {
  const r = await fetch(API + path, {
    method,
    headers: { 'X-API-Key': KEY, 'Content-Type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  })
  const text = await r.text()
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${text}`)
  return text ? JSON.parse(text) : null
}

const out = {}

// Sequential create → command, command round trip, kill.
{
  const create = [], run = [], kill = []
  await (await Sandbox.create(TEMPLATE)).kill() // warm-up
  for (let i = 0; i < N; i++) {
    let t = now()
    const sbx = await Sandbox.create(TEMPLATE)
    await sbx.commands.run('true')
    create.push(now() - t)
    for (let j = 0; j < 5; j++) {
      t = now()
      await sbx.commands.run('true')
      run.push(now() - t)
    }
    t = now()
    await sbx.kill()
    kill.push(now() - t)
  }
  Object.assign(out, { create: stats(create), run: stats(run), kill: stats(kill) })
}

// Rollouts: create, 3 commands, a 4 KiB file write, kill; INFLIGHT at once.
{
  let ok = 0, failed = 0
  const errors = {}
  const start = now()
  const end = start + ROLLOUT_S * 1000
  async function loop() {
    while (now() < end) {
      let sbx
      try {
        sbx = await Sandbox.create(TEMPLATE)
        for (let i = 0; i < 3; i++) await sbx.commands.run('true')
        await sbx.files.write('/tmp/x', 'a'.repeat(4096))
        ok++
      } catch (e) {
        failed++
        const m = String((e && e.message) || e).slice(0, 300)
        errors[m] = (errors[m] || 0) + 1
      } finally {
        if (sbx) await sbx.kill().catch(() => {})
      }
    }
  }
  await Promise.all(Array.from({ length: INFLIGHT }, loop))
  const secs = (now() - start) / 1000
  out.rollouts = { inflight: INFLIGHT, ok, failed, perSecond: +(ok / secs).toFixed(2), errors }
}

// Fork FORK_N: from the call until every child ran a command.
{
  const fork = []
  const parent = await Sandbox.create(TEMPLATE, { timeoutMs: 600_000 })
  await parent.commands.run('echo parent > /tmp/state')
  for (let i = 0; i < FORK_SAMPLES; i++) {
    const t = now()
    const res = await api('POST', `/sandboxes/${parent.sandboxId}/fork`, { count: FORK_N })
    const failedKids = res.filter((e) => e.error)
    if (failedKids.length) throw new Error(`fork: ${failedKids.length} children failed: ${failedKids[0].error.message}`)
    const kids = res.map((e) => e.sandbox)
    await Promise.all(kids.map(async (k) => {
      const c = await Sandbox.connect(k.sandboxID)
      await c.commands.run('cat /tmp/state')
    }))
    fork.push(now() - t)
    await Promise.all(kids.map((k) => api('DELETE', `/sandboxes/${k.sandboxID}`).catch(() => {})))
  }
  await parent.kill()
  out.fork = { children: FORK_N, ...stats(fork) }
}

console.log(JSON.stringify(out, null, 1))
