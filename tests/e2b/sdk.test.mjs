// Compatibility test: the official e2b JS SDK (pinned in package.json)
// against a running agentenv server. The Go test harness starts a server and
// runs `node --test` here with E2B_API_URL (REST API), E2B_SANDBOX_URL (the
// sandbox proxy) and E2B_API_KEY set.
//
// One sandbox of the tiny 'busybox' template serves most checks; every
// sandbox created here is killed in the `after` hook, also on failure.

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'

import {
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  Sandbox,
  SandboxNotFoundError,
  TimeoutError,
} from 'e2b'

const REQUIRED_ENV = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']
const missingEnv = REQUIRED_ENV.filter((k) => !process.env[k])
if (missingEnv.length > 0) {
  // Without these the SDK would talk to the public e2b.app service.
  throw new Error(
    `sdk.test.mjs: missing environment variable(s) ${missingEnv.join(', ')}. ` +
      'Set E2B_API_URL to the agentenv REST API (e.g. http://127.0.0.1:3000), ' +
      'E2B_SANDBOX_URL to the agentenv sandbox proxy (e.g. http://127.0.0.1:3001) ' +
      'and E2B_API_KEY to the server API key.',
  )
}
if (process.env.E2B_DEBUG) {
  throw new Error('sdk.test.mjs: unset E2B_DEBUG; in debug mode the SDK skips the API entirely')
}

const SANDBOX_URL = process.env.E2B_SANDBOX_URL.replace(/\/+$/, '')
const TEMPLATE = 'busybox'
const ENVD_PORT = '49983'
const T = { timeout: 120_000 }

const sha256 = (buf) => createHash('sha256').update(buf).digest('hex')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const suite = `sdk-${randomBytes(6).toString('hex')}`
// A second metadata pair with characters the SDK's (triple) query encoding
// must carry through: space, &, =, %, +, non-ASCII.
const oddKey = 'odd key&='
const oddVal = `a b&c=d%20+é ${suite}`
const metadata = { suite, [oddKey]: oddVal }

// Every sandbox this file creates, so `after` can kill them all.
const created = new Set()

async function createSandbox(template, opts) {
  const sbx = await Sandbox.create(template, opts)
  created.add(sbx.sandboxId)
  return sbx
}

after(async () => {
  const errors = []
  for (const id of created) {
    try {
      await Sandbox.kill(id)
    } catch (err) {
      errors.push(`${id}: ${err}`)
    }
  }
  if (errors.length) console.error(`cleanup: could not kill ${errors.join('; ')}`)
})

/**
 * Polls fn until it returns a truthy value or the deadline passes (a safety
 * net, not a measurement: a loaded CI host can stall for seconds).
 */
async function eventually(fn, { timeoutMs = 30_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > deadline) return v
    await sleep(intervalMs)
  }
}

describe('e2b SDK against agentenv', { concurrency: false }, () => {
  /** @type {Sandbox | undefined} */
  let sbx
  const need = () => {
    if (!sbx) throw new Error('the shared sandbox was not created (see the first failing test)')
    return sbx
  }

  test('Sandbox.create(busybox) with envs and metadata', T, async () => {
    sbx = await createSandbox(TEMPLATE, {
      envs: { FOO: 'bar' },
      metadata,
      timeoutMs: 120_000,
    })
    assert.equal(typeof sbx.sandboxId, 'string')
    assert.ok(sbx.sandboxId.length > 0, 'sandboxId is empty')
    // The wrong-token test below relies on envd being protected.
    assert.equal(typeof sbx.envdAccessToken, 'string', 'create returned no envdAccessToken')
    assert.ok(sbx.envdAccessToken.length > 0, 'envdAccessToken is empty')
  })

  test('commands.run: echo hi', T, async () => {
    const r = await need().commands.run('echo hi')
    assert.equal(r.stdout, 'hi\n')
    assert.equal(r.stderr, '')
    assert.equal(r.exitCode, 0)
  })

  test('commands.run: default user and working directory', T, async () => {
    const r = await need().commands.run('id -un; pwd')
    assert.equal(r.stdout, 'user\n/home/user\n')
  })

  test('commands.run: HOME, USER of the default user', T, async () => {
    const r = await need().commands.run('echo "$USER $HOME"')
    assert.equal(r.stdout, 'user /home/user\n')
  })

  test('commands.run: as root', T, async () => {
    const r = await need().commands.run('id -un; pwd; echo "$HOME"', { user: 'root' })
    assert.equal(r.stdout, 'root\n/root\n/root\n')
  })

  test('commands.run: stdin is closed unless asked for', T, async () => {
    // `cat` would hang forever if stdin were left open.
    const r = await need().commands.run('cat; echo done', { timeoutMs: 30_000 })
    assert.equal(r.stdout, 'done\n')
  })

  test('commands.run: timeoutMs ends a long command with TimeoutError', T, async () => {
    const s = need()
    const t0 = Date.now()
    await assert.rejects(s.commands.run('sleep 30', { timeoutMs: 1_000 }), (err) => {
      assert.ok(err instanceof TimeoutError, `expected TimeoutError, got ${err?.name}: ${err?.message}`)
      return true
    })
    // Far below the 30 s the command would take: the timeout ended it.
    assert.ok(Date.now() - t0 < 20_000, 'timeout took far longer than 1 s')
    // The command must be gone, not just abandoned.
    const left = await eventually(async () => !(await s.commands.list()).some((p) => p.args.includes('sleep 30')))
    assert.ok(left, 'the timed-out command is still running')
  })

  test('commands.run: streams stdout and stderr to callbacks', T, async () => {
    let out = ''
    let err = ''
    const r = await need().commands.run('echo one; echo two >&2; echo three', {
      onStdout: (d) => (out += d),
      onStderr: (d) => (err += d),
    })
    assert.equal(out, 'one\nthree\n')
    assert.equal(err, 'two\n')
    assert.equal(r.stdout, 'one\nthree\n')
    assert.equal(r.stderr, 'two\n')
  })

  test('env vars: sandbox envs, per-command envs, cwd', T, async () => {
    const s = need()
    assert.equal((await s.commands.run('echo $FOO')).stdout, 'bar\n', 'create-time envs not visible')
    const r = await s.commands.run('echo "$A:$FOO"', { envs: { A: 'x' } })
    assert.equal(r.stdout, 'x:bar\n', 'per-command envs not merged with sandbox envs')
    const o = await s.commands.run('echo $FOO', { envs: { FOO: 'override' } })
    assert.equal(o.stdout, 'override\n', 'per-command envs do not override sandbox envs')
    const c = await s.commands.run('pwd', { cwd: '/tmp' })
    assert.equal(c.stdout, '/tmp\n')
  })

  test('failing command rejects with CommandExitError', T, async () => {
    const s = need()
    await assert.rejects(s.commands.run('echo oops >&2; exit 7'), (err) => {
      assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`)
      assert.equal(err.exitCode, 7)
      assert.equal(err.stderr, 'oops\n')
      assert.equal(err.stdout, '')
      return true
    })
    await assert.rejects(s.commands.run('sh -c "exit 7"'), (err) => {
      assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`)
      assert.equal(err.exitCode, 7)
      return true
    })
  })

  test('background command: list, kill, gone', T, async () => {
    const s = need()
    const handle = await s.commands.run('sleep 300', { background: true })
    const pid = handle.pid
    assert.equal(typeof pid, 'number')
    assert.ok(pid > 0, `bad pid ${pid}`)
    // The handle must settle once the process is killed.
    const waited = handle.wait().then(
      (r) => ({ ok: true, r }),
      (err) => ({ ok: false, err }),
    )
    try {
      const procs = await s.commands.list()
      const p = procs.find((x) => x.pid === pid)
      assert.ok(p, `pid ${pid} not in commands.list(): ${JSON.stringify(procs)}`)
      assert.ok(
        [p.cmd, ...p.args].join(' ').includes('sleep 300'),
        `listed process does not show the command: ${JSON.stringify(p)}`,
      )

      assert.equal(await s.commands.kill(pid), true)
      const gone = await eventually(async () => !(await s.commands.list()).some((x) => x.pid === pid))
      assert.ok(gone, `pid ${pid} still listed 30 s after kill`)

      let timer
      const w = await Promise.race([
        waited,
        new Promise((r) => (timer = setTimeout(() => r('timeout'), 30_000))),
      ]).finally(() => clearTimeout(timer))
      assert.notEqual(w, 'timeout', 'handle.wait() did not settle after kill')
      assert.equal(w.ok, false, 'a killed command should not report success')
      assert.ok(w.err instanceof CommandExitError, `expected CommandExitError, got ${w.err}`)
      assert.notEqual(w.err.exitCode, 0)

      assert.equal(await s.commands.kill(pid), false, 'killing a gone pid should return false')
    } finally {
      await s.commands.kill(pid).catch(() => {})
    }
  })

  test('files: 5 MiB binary round trip and list', T, async () => {
    const s = need()
    const dir = `/home/user/data-${suite}`
    const path = `${dir}/blob.bin`
    const size = 5 * 1024 * 1024
    const data = randomBytes(size)
    const want = sha256(data)

    const info = await s.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + size))
    assert.equal(info.path, path)
    assert.equal(info.name, 'blob.bin')

    const got = await s.files.read(path, { format: 'bytes' })
    assert.ok(got instanceof Uint8Array, `read bytes gave ${Object.prototype.toString.call(got)}`)
    assert.equal(got.length, size)
    assert.equal(sha256(got), want, 'content read back differs from what was written')

    // Cross-check inside the sandbox: the bytes really are in its filesystem.
    const sum = await s.commands.run(`sha256sum ${path}`)
    assert.equal(sum.stdout.split(/\s+/)[0], want)

    const entries = await s.files.list(dir)
    const e = entries.find((x) => x.name === 'blob.bin')
    assert.ok(e, `blob.bin not listed in ${dir}: ${JSON.stringify(entries.map((x) => x.name))}`)
    assert.equal(e.type, 'file')
    assert.equal(e.size, size)
    assert.equal(e.path, path)

    const st = await s.files.getInfo(path)
    assert.equal(st.type, 'file')
    assert.equal(st.size, size)
    assert.equal(st.owner, 'user', 'files written without a user should belong to the default user')
  })

  test('files: makeDir, exists, getInfo, rename, remove', T, async () => {
    const s = need()
    const base = `/home/user/fs-${suite}`
    const dir = `${base}/a/b`

    assert.equal(await s.files.makeDir(dir), true, 'makeDir of a new path (with parents)')
    assert.equal(await s.files.makeDir(dir), false, 'makeDir of an existing dir should return false')
    assert.equal(await s.files.exists(dir), true)
    const di = await s.files.getInfo(dir)
    assert.equal(di.type, 'dir')
    assert.equal(di.name, 'b')
    assert.equal(di.path, dir)

    const f1 = `${dir}/one.txt`
    const f2 = `${dir}/two.txt`
    await s.files.write(f1, 'hello world')
    assert.equal(await s.files.exists(f1), true)
    const fi = await s.files.getInfo(f1)
    assert.equal(fi.type, 'file')
    assert.equal(fi.name, 'one.txt')
    assert.equal(fi.size, 11)

    const moved = await s.files.rename(f1, f2)
    assert.equal(moved.path, f2)
    assert.equal(moved.name, 'two.txt')
    assert.equal(await s.files.exists(f1), false, 'old path still exists after rename')
    assert.equal(await s.files.exists(f2), true)
    assert.equal(await s.files.read(f2), 'hello world')

    await s.files.remove(f2)
    assert.equal(await s.files.exists(f2), false, 'file still exists after remove')
    await assert.rejects(s.files.getInfo(f2), FileNotFoundError)
    await assert.rejects(s.files.read(f2), FileNotFoundError)
    // As on E2B (its envd removes with RemoveAll), a missing path is no error.
    await s.files.remove(f2)

    await s.files.remove(base)
    assert.equal(await s.files.exists(base), false, 'directory still exists after remove')
  })

  test('files: write multiple files in one call', T, async () => {
    const s = need()
    const dir = `/home/user/multi-${suite}`
    const res = await s.files.write([
      { path: `${dir}/a.txt`, data: 'AAA' },
      { path: `${dir}/sub/b.txt`, data: new TextEncoder().encode('BB').buffer },
      // Relative paths resolve against the default user's home.
      { path: `multi-${suite}/c.txt`, data: 'C' },
    ])
    assert.equal(res.length, 3, `expected 3 entries, got ${JSON.stringify(res)}`)
    assert.deepEqual(
      res.map((x) => x.path),
      [`${dir}/a.txt`, `${dir}/sub/b.txt`, `${dir}/c.txt`],
    )
    assert.equal(await s.files.read(`${dir}/a.txt`), 'AAA')
    assert.equal(await s.files.read(`${dir}/sub/b.txt`), 'BB')
    assert.equal(await s.files.read(`${dir}/c.txt`), 'C')
    const names = (await s.files.list(dir)).map((x) => x.name).sort()
    assert.deepEqual(names, ['a.txt', 'c.txt', 'sub'])
  })

  test('isRunning, Sandbox.list and metadata filter', T, async () => {
    const s = need()
    assert.equal(await s.isRunning(), true)

    const all = await Sandbox.list().nextItems()
    const mine = all.find((x) => x.sandboxId === s.sandboxId)
    assert.ok(mine, `Sandbox.list() does not include ${s.sandboxId}`)
    assert.equal(mine.templateId, TEMPLATE)
    assert.equal(mine.state, 'running')
    assert.deepEqual(mine.metadata, metadata)

    const filtered = await Sandbox.list({ query: { metadata: { suite } } }).nextItems()
    assert.deepEqual(
      filtered.map((x) => x.sandboxId),
      [s.sandboxId],
      'metadata filter should return exactly this sandbox',
    )
    const odd = await Sandbox.list({ query: { metadata: { [oddKey]: oddVal } } }).nextItems()
    assert.deepEqual(
      odd.map((x) => x.sandboxId),
      [s.sandboxId],
      'metadata filter with special characters should return exactly this sandbox',
    )
    const both = await Sandbox.list({ query: { metadata } }).nextItems()
    assert.deepEqual(both.map((x) => x.sandboxId), [s.sandboxId], 'filter on two metadata pairs')
    const none = await Sandbox.list({ query: { metadata: { suite: `${suite}-other` } } }).nextItems()
    assert.deepEqual(none, [], 'metadata filter with another value should return nothing')
  })

  test('setTimeout and getInfo', T, async () => {
    const s = need()
    await s.setTimeout(90_000)
    const before = Date.now()
    const info = await s.getInfo()
    assert.equal(info.sandboxId, s.sandboxId)
    assert.equal(info.templateId, TEMPLATE)
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, metadata)
    assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), `bad startedAt ${info.startedAt}`)
    assert.ok(info.endAt instanceof Date && !isNaN(info.endAt), `bad endAt ${info.endAt}`)
    const left = info.endAt.getTime() - before
    assert.ok(left > 75_000 && left <= 95_000, `endAt should be ~90 s from now after setTimeout(90 s), is ${left} ms`)

    await s.setTimeout(120_000)
    const info2 = await Sandbox.getInfo(s.sandboxId)
    const left2 = info2.endAt.getTime() - Date.now()
    assert.ok(left2 > 105_000 && left2 <= 125_000, `endAt should be ~120 s from now, is ${left2} ms`)
  })

  test('Sandbox.connect reaches the same sandbox', T, async () => {
    const s = need()
    const s2 = await Sandbox.connect(s.sandboxId)
    assert.equal(s2.sandboxId, s.sandboxId)
    assert.equal((await s2.commands.run('echo $FOO')).stdout, 'bar\n')
  })

  test('envd rejects a wrong access token', T, async () => {
    const s = need()
    // A file of our own: the busybox template has no /etc/hostname.
    const path = `/home/user/token-${suite}.txt`
    await s.files.write(path, 'secret')
    const url = `${SANDBOX_URL}/files?path=${encodeURIComponent(path)}`
    const headers = { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': ENVD_PORT }

    const wrong = await fetch(url, { headers: { ...headers, 'X-Access-Token': 'wrong-token' } })
    await wrong.arrayBuffer()
    assert.equal(wrong.status, 401, 'wrong X-Access-Token')

    const none = await fetch(url, { headers })
    await none.arrayBuffer()
    assert.equal(none.status, 401, 'missing X-Access-Token')

    // Control: the same request with the real token works.
    const ok = await fetch(url, { headers: { ...headers, 'X-Access-Token': s.envdAccessToken } })
    const body = await ok.text()
    assert.equal(ok.status, 200, `right X-Access-Token: ${body}`)
    assert.equal(body, 'secret')

    // The Connect RPC side is protected too.
    const rpc = await fetch(`${SANDBOX_URL}/process.Process/List`, {
      method: 'POST',
      headers: {
        ...headers,
        'X-Access-Token': 'wrong-token',
        'Content-Type': 'application/json',
        'Connect-Protocol-Version': '1',
      },
      body: '{}',
    })
    await rpc.arrayBuffer()
    assert.equal(rpc.status, 401, 'Process/List with a wrong X-Access-Token')
  })

  test('sandbox.kill ends it', T, async () => {
    const s = need()
    const id = s.sandboxId
    assert.equal(await s.kill(), true)
    created.delete(id)

    const running = await s.isRunning().catch(() => false)
    assert.equal(running, false, 'isRunning() after kill')
    await assert.rejects(Sandbox.getInfo(id), SandboxNotFoundError, 'Sandbox.getInfo of a killed sandbox')
    const listed = await Sandbox.list({ query: { metadata: { suite } } }).nextItems()
    assert.deepEqual(listed, [], 'killed sandbox still listed')
    await assert.rejects(s.commands.run('echo hi', { timeoutMs: 10_000 }), 'commands.run on a killed sandbox')
    assert.equal(await Sandbox.kill(id), false, 'second kill should return false')
  })
})

describe('sandbox lifecycle', { concurrency: false }, () => {
  // Sandboxes come and go; a new one must be usable at once even when it
  // reuses resources (network slot, address) of one just killed.
  test('a new sandbox works right after an earlier one was killed', T, async () => {
    const a = await createSandbox(TEMPLATE, { timeoutMs: 60_000 })
    assert.equal((await a.commands.run('echo a')).stdout, 'a\n')
    assert.equal(await a.files.exists('/home/user'), true)
    assert.equal(await a.kill(), true)
    created.delete(a.sandboxId)

    const b = await createSandbox(TEMPLATE, { timeoutMs: 60_000 })
    assert.notEqual(b.sandboxId, a.sandboxId)
    assert.equal((await b.commands.run('echo b')).stdout, 'b\n', 'first command in the new sandbox')
    assert.equal(await b.files.exists('/home/user'), true, 'first file call in the new sandbox')
    assert.equal(await b.isRunning(), true)
    assert.equal(await b.kill(), true)
    created.delete(b.sandboxId)
  })
})

describe('errors', { concurrency: false }, () => {
  test('Sandbox.kill of an unknown id returns false', T, async () => {
    assert.equal(await Sandbox.kill(`nosuchsandbox${randomBytes(4).toString('hex')}`), false)
  })

  test('Sandbox.getInfo of an unknown id rejects', T, async () => {
    await assert.rejects(Sandbox.getInfo(`nosuchsandbox${randomBytes(4).toString('hex')}`), SandboxNotFoundError)
  })

  test('wrong API key: AuthenticationError', T, async () => {
    const apiKey = `wrong-${randomBytes(8).toString('hex')}`
    await assert.rejects(
      createSandbox(TEMPLATE, { apiKey }),
      (err) => {
        assert.ok(err instanceof AuthenticationError, `expected AuthenticationError, got ${err?.name}: ${err?.message}`)
        return true
      },
    )
    await assert.rejects(Sandbox.list({ apiKey }).nextItems(), AuthenticationError)
  })

  test('unknown template rejects', T, async () => {
    await assert.rejects(createSandbox(`no-such-template-${randomBytes(4).toString('hex')}`))
  })
})

// Pause/resume, snapshots and fork through the SDK's own calls (agentenv
// implements E2B's routes for them: /pause, /v2/sandboxes/{id}/connect,
// /snapshots, /fork).
describe('pause, snapshot and fork', { concurrency: false }, () => {
  test('pause → connect (resumes) → commands.run', T, async () => {
    const sbx = await createSandbox(TEMPLATE, { timeoutMs: 120_000 })
    await sbx.commands.run('echo kept > /tmp/kept')
    assert.equal(await sbx.pause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal(await sbx.pause(), false, 'pausing a paused sandbox reports false')
    await sbx.connect()
    assert.equal((await sbx.getInfo()).state, 'running')
    const r = await sbx.commands.run('cat /tmp/kept')
    assert.equal(r.stdout, 'kept\n')
  })

  test('fork gives working, isolated children', T, async () => {
    const parent = await createSandbox(TEMPLATE)
    await parent.commands.run('echo parent > /tmp/p')
    const kids = await parent.fork({ count: 2 })
    assert.equal(kids.length, 2)
    for (const k of kids) {
      assert.ok(!(k instanceof Error), `fork child failed: ${k}`)
      created.add(k.sandboxId)
      assert.notEqual(k.sandboxId, parent.sandboxId)
      assert.equal((await k.commands.run('cat /tmp/p')).stdout, 'parent\n')
    }
    await kids[0].commands.run('echo x > /tmp/only0')
    assert.ok(!(await kids[1].commands.run('ls /tmp')).stdout.includes('only0'))
    assert.ok(!(await parent.commands.run('ls /tmp')).stdout.includes('only0'))
  })

  test('createSnapshot → Sandbox.create(snapshotId) → deleteSnapshot', T, async () => {
    const src = await createSandbox(TEMPLATE)
    await src.commands.run('echo snap > /tmp/s')
    const snap = await src.createSnapshot({ name: `sdk-${suite}` })
    assert.ok(snap.snapshotId, 'snapshot id')
    const restored = await createSandbox(snap.snapshotId)
    assert.equal((await restored.commands.run('cat /tmp/s')).stdout, 'snap\n')
    await restored.kill()
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  })
})
