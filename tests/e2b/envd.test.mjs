// envd parity: what the official e2b JS SDK (2.51.0) expects of envd 0.6.x
// — file metadata, watch options and events, EntryInfo details, signed URL
// errors and PTYs — against a running agentenv server. The Go test
// TestE2BEnvd (internal/server/e2b_envd_test.go) starts the server and runs
// `node --test envd.test.mjs` here with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set. One busybox sandbox serves every check; it is killed in
// the `after` hook, also on failure.

import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

import { Sandbox } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  // Without these the SDK would talk to the public e2b.app service.
  if (!process.env[k]) throw new Error(`envd.test.mjs: set ${k} (see sdk.test.mjs)`)
}
if (process.env.E2B_DEBUG) throw new Error('envd.test.mjs: unset E2B_DEBUG')

const SANDBOX_URL = process.env.E2B_SANDBOX_URL.replace(/\/+$/, '')
const T = { timeout: 120_000 }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const enc = new TextEncoder()
const dec = new TextDecoder()

/** Polls fn until it returns a truthy value or the deadline passes. */
// The deadline is a safety net, not a measurement: a loaded CI host can
// stall for seconds.
async function eventually(fn, { timeoutMs = 30_000, intervalMs = 50 } = {}) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v || Date.now() > deadline) return v
    await sleep(intervalMs)
  }
}

describe('envd 0.6.x parity with the e2b SDK', { concurrency: false }, () => {
  /** @type {Sandbox} */
  let sbx
  const dir = `/home/user/envd-${randomBytes(4).toString('hex')}`

  before(async () => {
    sbx = await Sandbox.create('busybox', { timeoutMs: 180_000 })
    await sbx.files.makeDir(dir)
  })
  after(async () => {
    if (sbx) await Sandbox.kill(sbx.sandboxId).catch((err) => console.error(`cleanup: ${err}`))
  })

  test('envd reports 0.6.4, the newest version the SDK checks for', T, () => {
    assert.equal(sbx.envdApi.version, '0.6.4')
  })

  test('files.write with metadata; getInfo and list read it back', T, async () => {
    const f = `${dir}/meta.txt`
    const w = await sbx.files.write(f, 'data', { metadata: { owner: 'alice', Step: '3' } })
    assert.deepEqual(w.metadata, { owner: 'alice', step: '3' }, 'keys come back lower-cased, as E2B')
    assert.deepEqual((await sbx.files.getInfo(f)).metadata, { owner: 'alice', step: '3' })
    const listed = (await sbx.files.list(dir)).find((e) => e.path === f)
    assert.deepEqual(listed?.metadata, { owner: 'alice', step: '3' })
    // An overwrite replaces the set; the octet-stream (gzip) upload carries it too.
    await sbx.files.write(f, 'again', { metadata: { step: '4' }, gzip: true })
    assert.deepEqual((await sbx.files.getInfo(f)).metadata, { step: '4' })
    await sbx.files.write(f, 'plain')
    assert.equal((await sbx.files.getInfo(f)).metadata, undefined, 'a write without metadata clears it')
  })

  test('watchDir with includeEntry and allowNetworkMounts; files.write emits E2B\'s events', T, async () => {
    const events = []
    const h = await sbx.files.watchDir(dir, (e) => events.push(e), { includeEntry: true, allowNetworkMounts: true })
    const settled = async () => {
      // The events of a write that returned may still be on their way (a
      // loaded host delays the stream): wait for its write event first,
      // then for 300 ms without a new one.
      await eventually(() => events.some((e) => e.type === 'write'))
      let n = -1
      while (n !== events.length) {
        n = events.length
        await sleep(300)
      }
      return events.splice(0).map((e) => `${e.name}:${e.type}`)
    }
    try {
      const f = `${dir}/watched.txt`
      await sbx.files.write(f, 'hello')
      await eventually(() => events.find((e) => e.name === 'watched.txt' && e.type === 'write'))
      const write = events.find((e) => e.type === 'write')
      assert.equal(write?.entry?.path, f, 'the write event carries the entry (includeEntry)')
      assert.equal(write?.entry?.type, 'file')
      // E2B's envd creates the file, chowns it to the user, writes it:
      // E2B's Python test_watch_iterated counts these three.
      assert.deepEqual(await settled(), ['watched.txt:create', 'watched.txt:chmod', 'watched.txt:write'])
      // An existing file is chowned, then truncated and written.
      await sbx.files.write(f, 'hello again')
      const again = await settled()
      assert.equal(again[0], 'watched.txt:chmod', `existing file: ${again}`)
      assert.ok(again.length > 1 && again.slice(1).every((e) => e === 'watched.txt:write'), `existing file: ${again}`)
    } finally {
      await h.stop()
    }
  })

  test('files.write as the default user makes parents even under / and hands them over, as E2B', T, async () => {
    const top = `/e2b-${randomBytes(4).toString('hex')}`
    const w = await sbx.files.write(`${top}/a/x.txt`, 'mine')
    assert.equal(w.path, `${top}/a/x.txt`)
    const r = await sbx.commands.run(`stat -c '%n %U:%G %a' ${top} ${top}/a ${top}/a/x.txt`)
    assert.equal(r.stdout, `${top} user:user 755\n${top}/a user:user 755\n${top}/a/x.txt user:user 644\n`)
    // A root file written by the user becomes the user's (E2B chowns it).
    await sbx.files.write(`${top}/root.txt`, 'r', { user: 'root' })
    assert.equal((await sbx.files.getInfo(`${top}/root.txt`)).owner, 'root')
    await sbx.files.write(`${top}/root.txt`, 'u')
    assert.equal((await sbx.files.getInfo(`${top}/root.txt`)).owner, 'user')
    const d = await sbx.files.makeDir(`${top}/m/n`)
    assert.ok(d)
    assert.equal((await sbx.files.getInfo(`${top}/m`)).owner, 'user')
    await sbx.files.remove(top)
    assert.equal(await sbx.files.exists(top), false)
  })

  test('EntryInfo: directory mode, resolved symlink target; remove of a missing path', T, async () => {
    const sub = `${dir}/sub`
    await sbx.files.makeDir(sub)
    const di = await sbx.files.getInfo(sub)
    assert.equal(di.mode, 0o755, `directory mode ${di.mode}: permission bits only`)
    await sbx.files.write(`${dir}/target.txt`, 'x')
    await sbx.commands.run(`ln -s target.txt ${dir}/link`)
    const li = await sbx.files.getInfo(`${dir}/link`)
    assert.equal(li.symlinkTarget, `${dir}/target.txt`, 'the resolved absolute path')
    assert.equal(li.type, 'file', 'the type of what the link leads to')
    await sbx.files.remove(`${dir}/does-not-exist`)
  })

  test('an expired signed URL is refused with envd\'s text', T, async () => {
    const f = `${dir}/signed.txt`
    await sbx.files.write(f, 'signed')
    const get = async (u) => {
      const url = new URL(u)
      return fetch(`${SANDBOX_URL}${url.pathname}${url.search}`, {
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' },
      })
    }
    const ok = await get(await sbx.downloadUrl(f, { useSignatureExpiration: 60 }))
    assert.equal(ok.status, 200)
    assert.equal(await ok.text(), 'signed')
    const expired = await get(await sbx.downloadUrl(f, { useSignatureExpiration: -10 }))
    assert.equal(expired.status, 401)
    assert.equal((await expired.json()).message, 'signature is already expired')
  })

  test('pty: create with a size, sendInput, resize, connect, kill', T, async () => {
    let out = ''
    const h = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => (out += dec.decode(d)), timeoutMs: 60_000 })
    const pid = h.pid
    try {
      await sbx.pty.sendInput(pid, enc.encode('stty size\n'))
      assert.ok(await eventually(() => out.includes('30 100')), `no "30 100" in ${JSON.stringify(out)}`)
      await sbx.pty.resize(pid, { cols: 120, rows: 50 })
      await sbx.pty.sendInput(pid, enc.encode('stty size\n'))
      assert.ok(await eventually(() => out.includes('50 120')), `no "50 120" after resize in ${JSON.stringify(out)}`)

      let again = ''
      const h2 = await sbx.pty.connect(pid, { onData: (d) => (again += dec.decode(d)) })
      assert.equal(h2.pid, pid)
      await sbx.pty.sendInput(pid, enc.encode('echo re$((1+1))connected\n'))
      assert.ok(await eventually(() => again.includes('re2connected')), `connected handle got ${JSON.stringify(again)}`)

      assert.equal(await sbx.pty.kill(pid), true)
      const r = await h.wait().catch((err) => err)
      assert.notEqual(r.exitCode, 0, 'a killed PTY does not end with 0')
      const listed = await sbx.commands.list()
      assert.ok(!listed.some((p) => p.pid === pid), 'the killed PTY is still listed')
    } finally {
      await sbx.pty.kill(pid).catch(() => {})
    }
  })
})
