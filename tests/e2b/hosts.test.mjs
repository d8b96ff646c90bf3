// Host-based URLs: the official e2b JS SDK (2.51.0) used the way E2B's
// cloud is used — no E2B_SANDBOX_URL, so envd, getHost(port), downloadUrl
// and uploadUrl are https://<port>-<sandboxID>.<domain> with the domain of
// the create answer — against an agentenv server started with
// --domain agentenv.localhost, trusting only its local CA
// (NODE_EXTRA_CA_CERTS). Names under .localhost resolve to loopback
// through nss-myhostname, so all traffic stays on this machine. The Go
// test TestE2BHosts (internal/server/e2b_hosts_test.go) runs it with
// E2B_API_URL, E2B_API_KEY, NODE_EXTRA_CA_CERTS and AGENTENV_PLAIN_PROXY
// (the plain proxy, for signed URLs built on E2B_SANDBOX_URL).

import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

import { Sandbox } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_API_KEY', 'NODE_EXTRA_CA_CERTS', 'AGENTENV_PLAIN_PROXY']) {
  if (!process.env[k]) throw new Error(`hosts.test.mjs: set ${k} (see internal/server/e2b_hosts_test.go)`)
}
if (process.env.E2B_SANDBOX_URL) throw new Error('hosts.test.mjs: unset E2B_SANDBOX_URL: this test reaches sandboxes by host')
if (process.env.E2B_DEBUG) throw new Error('hosts.test.mjs: unset E2B_DEBUG')

const PLAIN_PROXY = process.env.AGENTENV_PLAIN_PROXY.replace(/\/+$/, '')
const T = { timeout: 120_000 }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Polls fn until it returns a truthy value or the deadline passes. */
// The deadline is a safety net, not a measurement: a loaded CI host can
// stall for seconds.
async function eventually(fn, { timeoutMs = 30_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await fn().catch(() => undefined)
    if (v || Date.now() > deadline) return v
    await sleep(intervalMs)
  }
}

/** Starts busybox httpd on port in sbx, serving body as /index.html. */
async function serve(sbx, port, body) {
  await sbx.files.write(`/tmp/www${port}/index.html`, body)
  await sbx.commands.run(`httpd -p ${port} -h /tmp/www${port}`)
}

/** Uploads data to a URL of uploadUrl as E2B documents it (multipart, field "file"). */
async function upload(url, data) {
  const form = new FormData()
  form.append('file', new Blob([data]), 'f')
  return fetch(url, { method: 'POST', body: form })
}

describe('host-based URLs over HTTPS with the local CA', { concurrency: false }, () => {
  /** @type {Sandbox} */
  let sbx
  const made = []
  const dir = `/home/user/hosts-${randomBytes(4).toString('hex')}`

  before(async () => {
    sbx = await Sandbox.create('busybox', { timeoutMs: 180_000 })
    made.push(sbx.sandboxId)
    await sbx.files.makeDir(dir)
  })
  after(async () => {
    delete process.env.E2B_SANDBOX_URL
    for (const id of made) await Sandbox.kill(id).catch((err) => console.error(`cleanup: ${err}`))
  })

  test('the create answer\'s domain makes envd https://49983-<id>.<domain>, and the SDK works through it', T, async () => {
    assert.match(sbx.sandboxDomain, /^agentenv\.localhost:\d+$/, 'the domain carries the HTTPS port')
    assert.equal(sbx.envdApiUrl, `https://49983-${sbx.sandboxId}.${sbx.sandboxDomain}`)
    const r = await sbx.commands.run('echo over-https')
    assert.equal(r.stdout, 'over-https\n')
  })

  test('getHost: a web server started in the sandbox answers at https:// + getHost(port)', T, async () => {
    await serve(sbx, 8000, 'hello from the sandbox\n')
    const host = sbx.getHost(8000)
    assert.equal(host, `8000-${sbx.sandboxId}.${sbx.sandboxDomain}`)
    const res = await eventually(async () => {
      const r = await fetch(`https://${host}/index.html`)
      return r.ok ? r : undefined
    })
    assert.ok(res, `https://${host}/index.html did not answer 200`)
    assert.equal(await res.text(), 'hello from the sandbox\n')
    const closed = await fetch(`https://${sbx.getHost(8001)}/`)
    assert.equal(closed.status, 502, 'a port nothing listens on: E2B\'s 502')
    assert.equal((await closed.json()).message, 'The sandbox is running but port is not open')
  })

  test('uploadUrl and downloadUrl round-trip a file; an expired signature gets 401 with E2B\'s text', T, async () => {
    const f = `${dir}/signed.bin`
    const data = randomBytes(4096)
    const up = await sbx.uploadUrl(f, { useSignatureExpiration: 60 })
    assert.ok(up.startsWith(`https://49983-${sbx.sandboxId}.${sbx.sandboxDomain}/files?`), up)
    const ur = await upload(up, data)
    assert.equal(ur.status, 200, await ur.clone().text())
    const down = await sbx.downloadUrl(f, { useSignatureExpiration: 60 })
    const dr = await fetch(down)
    assert.equal(dr.status, 200)
    assert.deepEqual(Buffer.from(await dr.arrayBuffer()), data)
    const noExpiry = await fetch(await sbx.downloadUrl(f))
    assert.equal(noExpiry.status, 200, 'a signature without expiry')
    const expired = await fetch(await sbx.downloadUrl(f, { useSignatureExpiration: -10 }))
    assert.equal(expired.status, 401)
    assert.equal((await expired.json()).message, 'signature is already expired')
    const expiredUp = await upload(await sbx.uploadUrl(f, { useSignatureExpiration: -10 }), 'x')
    assert.equal(expiredUp.status, 401)
    assert.equal((await expiredUp.json()).message, 'signature is already expired')
  })

  test('signed URLs built on E2B_SANDBOX_URL (no sandbox in them) reach the sandbox that signed them', T, async () => {
    const f = `${dir}/shared-url.txt`
    await sbx.files.write(f, 'via the shared sandbox URL')
    process.env.E2B_SANDBOX_URL = PLAIN_PROXY
    try {
      const other = await Sandbox.create('busybox', { timeoutMs: 120_000 }) // a second sandbox to tell apart
      made.push(other.sandboxId)
      await other.files.write(f, 'the other sandbox')
      const same = await Sandbox.connect(sbx.sandboxId)
      const down = await same.downloadUrl(f, { useSignatureExpiration: 60 })
      assert.ok(down.startsWith(`${PLAIN_PROXY}/files?`), down)
      assert.ok(!down.includes(sbx.sandboxId), `the SDK's URL names no sandbox: ${down}`)
      const dr = await fetch(down)
      assert.equal(dr.status, 200)
      assert.equal(await dr.text(), 'via the shared sandbox URL')
      const od = await fetch(await other.downloadUrl(f))
      assert.equal(await od.text(), 'the other sandbox')

      const g = `${dir}/uploaded.txt`
      const ur = await upload(await same.uploadUrl(g, { useSignatureExpiration: 60 }), 'uploaded by URL')
      assert.equal(ur.status, 200, await ur.clone().text())
      assert.equal(await sbx.files.read(g), 'uploaded by URL')

      const expired = await fetch(await same.downloadUrl(f, { useSignatureExpiration: -10 }))
      assert.equal(expired.status, 401)
      assert.equal((await expired.json()).message, 'signature is already expired')
      const forged = new URL(down)
      forged.searchParams.set('path', `${dir}/other.txt`)
      const fr = await fetch(forged)
      assert.equal(fr.status, 401, 'a signature does not open another path')
      assert.equal((await fr.json()).message, 'invalid signature')
    } finally {
      delete process.env.E2B_SANDBOX_URL
    }
  })

  test('autoResume: an HTTPS request to getHost(port) resumes a paused sandbox', T, async () => {
    const lazy = await Sandbox.create('busybox', { timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    made.push(lazy.sandboxId)
    await serve(lazy, 8080, 'resumed by traffic\n')
    const url = `https://${lazy.getHost(8080)}/index.html`
    assert.ok(await eventually(async () => (await fetch(url)).ok), `${url} did not answer before the pause`)
    assert.equal(await lazy.pause(), true)
    // The API, not envd: a request through the proxy would resume it.
    assert.equal((await lazy.getInfo()).state, 'paused')
    const res = await fetch(url)
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'resumed by traffic\n', 'the server process kept running across the pause')
    assert.equal((await lazy.getInfo()).state, 'running')
  })
})
