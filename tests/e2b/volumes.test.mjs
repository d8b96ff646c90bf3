// Volumes through the official e2b JS SDK (2.51.0): the control plane
// (Volume.create/getInfo/connect/list/destroy) and the volume content API
// (list, makeDir, getInfo, exists, updateMetadata, readFile, writeFile,
// remove) against a running agentenv server. The Go test TestE2BVolumes
// (internal/server/e2b_volumes_test.go) runs it with E2B_API_URL,
// E2B_VOLUME_API_URL (the SDK's content client reads only that one) and
// E2B_API_KEY set. Every volume made here is destroyed in `after`.

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`volumes.test.mjs: set ${k}`)
}

const T = { timeout: 60_000 }
const TS = { timeout: 180_000 }
const made = []
const name = (p) => `${p}-${randomBytes(4).toString('hex')}`

describe('volumes through the e2b SDK', { concurrency: false }, () => {
  const boxes = []
  after(async () => {
    for (const b of boxes) await b.kill().catch(() => {})
    for (const id of made) await Volume.destroy(id).catch(() => {})
  })

  test('create, get, connect, list, duplicate name, destroy', T, async () => {
    const n = name('vol')
    const vol = await Volume.create(n)
    made.push(vol.volumeId)
    assert.equal(vol.name, n)
    assert.match(vol.volumeId, /^[0-9a-f-]{36}$/)
    assert.ok(vol.token, 'create answers a token')

    const info = await Volume.getInfo(vol.volumeId)
    assert.equal(info.name, n)
    assert.equal(info.volumeId, vol.volumeId)
    const again = await Volume.connect(vol.volumeId)
    assert.equal(again.name, n)

    const listed = await Volume.list()
    assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === n), 'list has the volume')

    await assert.rejects(Volume.create(n), VolumeError, 'a second volume of the same name is refused')
    await assert.rejects(Volume.create('bad name!'), VolumeError, 'a bad name is refused')

    assert.equal(await Volume.destroy(vol.volumeId), true)
    assert.equal(await Volume.destroy(vol.volumeId), false, 'destroying it again answers false (404)')
    await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
  })

  test('content: write, read, list, mkdir, metadata, remove', T, async () => {
    const vol = await Volume.create(name('content'))
    made.push(vol.volumeId)

    const w = await vol.writeFile('/data/hello.txt', 'hello volume', { force: true })
    assert.equal(w.type, 'file')
    assert.equal(w.path, '/data/hello.txt')
    assert.equal(w.size, 12)
    assert.ok(w.mtime instanceof Date && !Number.isNaN(w.mtime.getTime()), 'mtime is a date')
    assert.equal(await vol.readFile('/data/hello.txt'), 'hello volume')
    const bytes = await vol.readFile('data/hello.txt', { format: 'bytes' })
    assert.equal(bytes.length, 12, 'a relative path starts at the top')

    await assert.rejects(vol.writeFile('/data/hello.txt', 'x'), VolumeError, 'overwrite without force is refused')
    await assert.rejects(vol.writeFile('/missing/f.txt', 'x'), VolumePathNotFoundError, 'a missing parent without force')
    await vol.writeFile('/data/hello.txt', 'replaced', { force: true })
    assert.equal(await vol.readFile('/data/hello.txt'), 'replaced')

    const d = await vol.makeDir('/a/b/c', { force: true })
    assert.equal(d.type, 'directory')
    await assert.rejects(vol.makeDir('/a'), VolumeError, 'mkdir of an existing directory without force')

    const top = await vol.list('/')
    assert.deepEqual(top.map((e) => e.name).sort(), ['a', 'data'])
    const deep = await vol.list('/', { depth: 3 })
    assert.deepEqual(deep.map((e) => e.path).sort(), ['/a', '/a/b', '/a/b/c', '/data', '/data/hello.txt'])

    assert.equal(await vol.exists('/data/hello.txt'), true)
    assert.equal(await vol.exists('/nope'), false)
    await assert.rejects(vol.getInfo('/nope'), VolumePathNotFoundError)
    await assert.rejects(vol.readFile('/../../../etc/passwd'), VolumePathNotFoundError, '.. never leaves the volume')

    const m = await vol.updateMetadata('/data/hello.txt', { mode: 0o600 })
    assert.equal(m.mode, 0o600)

    await vol.remove('/a')
    assert.equal(await vol.exists('/a/b/c'), false)
    await assert.rejects(vol.remove('/'), VolumeError, 'the top cannot be removed')

    // Another volume's token does not open this one.
    const other = await Volume.create(name('other'))
    made.push(other.volumeId)
    const forged = new Volume(vol.volumeId, vol.name, other.token)
    await assert.rejects(forged.readFile('/data/hello.txt'), /another volume/, "another volume's token is refused (401)")
  })

  test('mounted in two sandboxes at once, then in a third after both died', TS, async () => {
    const vol = await Volume.create(name('shared'))
    made.push(vol.volumeId)
    await vol.writeFile('/from-api.txt', 'written through the volume API', { force: true })

    const a = await Sandbox.create('busybox', { timeoutMs: 120_000, volumeMounts: { '/mnt/data': vol } })
    boxes.push(a)
    const b = await Sandbox.create('busybox', { timeoutMs: 120_000, volumeMounts: { '/data': vol.name } })
    boxes.push(b)
    const info = await Sandbox.getInfo(a.sandboxId)
    assert.deepEqual(info.volumeMounts, [{ name: vol.name, path: '/mnt/data' }], 'get shows the mount')

    assert.equal((await a.commands.run('cat /mnt/data/from-api.txt')).stdout, 'written through the volume API')
    await a.commands.run('echo from-a > /mnt/data/a.txt')
    await b.commands.run('echo from-b > /data/b.txt')
    assert.equal((await b.commands.run('cat /data/a.txt')).stdout.trim(), 'from-a', 'b sees what a wrote')
    assert.equal((await a.commands.run('cat /mnt/data/b.txt')).stdout.trim(), 'from-b', 'a sees what b wrote')
    assert.equal(await vol.readFile('/b.txt'), 'from-b\n', 'the volume API sees what b wrote')

    await assert.rejects(Volume.destroy(vol.volumeId), /mounted by sandbox/, 'delete is refused while mounted')
    await assert.rejects(
      Sandbox.create('busybox', { volumeMounts: { 'relative': vol, '/x/../y': vol } }),
      /invalid mounts:[\s\S]*#0: path must be absolute[\s\S]*#1: path must not contain/,
      'bad mounts are listed as E2B lists them',
    )
    await assert.rejects(Sandbox.create('busybox', { volumeMounts: { '/m': 'no-such-volume' } }), /volume 'no-such-volume' not found/)

    await a.kill()
    await b.kill()
    const c = await Sandbox.create('busybox', { timeoutMs: 120_000, volumeMounts: { '/v': vol } })
    boxes.push(c)
    assert.equal((await c.commands.run('cat /v/a.txt /v/b.txt')).stdout, 'from-a\nfrom-b\n', 'the data outlived both sandboxes')
    await c.kill()
    assert.equal(await Volume.destroy(vol.volumeId), true, 'delete after the last sandbox is gone')
  })
})
