// Dockerfile task templates as Harbor and Terminal-Bench build them through
// E2B's JS SDK (2.51.0): Template().fromDockerfile(…) with FROM, ARG, ENV,
// WORKDIR, COPY, RUN and USER, then Template.build(t, name, {cpuCount,
// memoryMB}), Template.exists, Sandbox.create, files.write([…]) and
// commands.run(cmd, {background, user}). The Go test TestE2BDockerfile
// (internal/server/e2b_dockerfile_test.go) sets E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY and: BUSYBOX_TEMPLATE (the server's busybox
// template, named as Docker Hub's image is), GNU_TEMPLATE ("base": a template of the host's GNU tools, the
// issue's FROM base), OTHER_TEMPLATE (another key's template, whose name
// the server's registry mirror also holds as an image), LAYER2_FILE and
// LAYER2_CONTENT (a file only that image has). COPY reads from this
// file's directory (the SDK's default context).

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

import { BuildError, Sandbox, Template } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'BUSYBOX_TEMPLATE', 'GNU_TEMPLATE', 'OTHER_TEMPLATE', 'LAYER2_FILE', 'LAYER2_CONTENT']) {
  if (!process.env[k]) throw new Error(`dockerfile.test.mjs: set ${k}`)
}
const TS = { timeout: 600_000 }
const prefix = `df-${randomBytes(4).toString('hex')}`

async function build(t, name, opts = {}) {
  const logs = []
  const began = Date.now()
  try {
    const info = await Template.build(t, name, { ...opts, onBuildLogs: (e) => logs.push(e.message) })
    return { info, logs, ms: Date.now() - began }
  } catch (err) {
    console.log(`build of ${name} failed: ${err.message}\nits log:\n${logs.join('\n')}`)
    throw err
  }
}

async function run(sbx, cmd, opts) {
  const r = await sbx.commands.run(cmd, opts)
  assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`)
  return r.stdout.trim()
}

describe('Dockerfile templates through the e2b SDK', { concurrency: false }, () => {
  const boxes = []
  after(async () => {
    for (const b of boxes) await b.kill().catch(() => {})
  })

  test('FROM a template of this server, every instruction, 8 sandboxes run the task test at once', TS, async () => {
    const name = `${prefix}-task`
    const dockerfile = [
      `FROM ${process.env.BUSYBOX_TEMPLATE}`,
      'ARG GREETING=hello',
      'ENV TASK_MODE=graded',
      'WORKDIR /srv/task',
      'COPY fixtures/df-task /srv/task',
      'RUN echo "$GREETING $TASK_MODE" > built.txt && chmod 755 check.sh',
      'USER runner',
    ].join('\n')
    const { logs, ms } = await build(Template().fromDockerfile(dockerfile), name)
    assert.ok(logs.some((l) => l.includes(`the template ${process.env.BUSYBOX_TEMPLATE} on this server`)),
      `FROM named the local template, not a pull:\n${logs.join('\n')}`)
    console.log(`Dockerfile template from the busybox template: built in ${ms} ms`)

    const n = 8
    const sbxs = await Promise.all(Array.from({ length: n }, () => Sandbox.create(name)))
    boxes.push(...sbxs)
    const outs = await Promise.all(sbxs.map((s, i) => s.commands.run(`sh check.sh box-${i}`).catch((e) => e)))
    outs.forEach((r, i) => {
      assert.equal(r.exitCode, 0, `sandbox ${i}: ${r.stdout} ${r.stderr}`)
      assert.equal(r.stdout.trim(), `PASS box-${i}`)
    })
    await Promise.all(sbxs.map((s) => s.kill()))
  })

  test('FROM base (GNU userland): RUN as root and as the USER, COPY --chown, and Harbor\'s calls', TS, async () => {
    const name = `${prefix}-gnu`
    assert.equal(await Template.exists(name), false, 'no template before its build')
    assert.equal(await Template.aliasExists(name), false)
    const dockerfile = [
      `FROM ${process.env.GNU_TEMPLATE}`,
      'ARG VERSION=1.2',
      'ENV TASK_VERSION=v1.2',
      "RUN echo 'agent:x:1001:1001::/home/agent:/bin/bash' >> /etc/passwd && echo 'agent:x:1001:' >> /etc/group && mkdir -p /home/agent && chown 1001:1001 /home/agent",
      'WORKDIR /task',
      'COPY --chown=agent:agent fixtures/df-task/data /task/data',
      'USER agent',
      'RUN id -un > ~/whoami && touch ~/made && echo "$VERSION $TASK_VERSION" > ~/version && ' +
        'grep MemTotal /proc/meminfo > ~/build-mem',
    ].join('\n')
    const { logs, ms } = await build(Template().fromDockerfile(dockerfile), name, { cpuCount: 1, memoryMB: 1024 })
    assert.ok(logs.some((l) => l.includes(`the template ${process.env.GNU_TEMPLATE} on this server`)),
      `FROM base named the local template:\n${logs.join('\n')}`)
    console.log(`Dockerfile template FROM base (GNU): built in ${ms} ms`)
    assert.equal(await Template.exists(name), true)
    assert.equal(await Template.aliasExists(name), true)
    assert.equal(await Template.exists(`${name}:default`), true)
    assert.equal(await Template.exists(`${name}:v9`), false, 'a tag the template does not have')

    const sbx = await Sandbox.create(name)
    boxes.push(sbx)
    assert.equal(await run(sbx, 'id -un'), 'agent', 'USER is the default user')
    assert.equal(await run(sbx, 'pwd'), '/task', 'WORKDIR is the default cwd')
    assert.equal(await run(sbx, 'cat ~/whoami'), 'agent', 'the RUN after USER ran as the user')
    assert.equal(await run(sbx, 'stat -c %U:%G ~/made /task/data /task/data/input.txt'), 'agent:agent\nagent:agent\nagent:agent',
      'what the user made and what COPY --chown copied are the user\'s')
    assert.equal(await run(sbx, 'stat -c %U /task'), 'root', 'the WORKDIR made while root is root\'s')
    assert.equal(await run(sbx, 'echo "$TASK_VERSION"; cat ~/version'), 'v1.2\n1.2 v1.2', 'ENV and ARG')
    // The build's memoryMB was its build sandbox's limit (gVisor shows at
    // least 2 CPUs whatever the quota: the CPU quota is checked in
    // imagebuild's tests), and cpuCount and memoryMB are its sandboxes'
    // defaults.
    assert.match(await run(sbx, 'cat ~/build-mem'), /^MemTotal:\s+1048576 kB$/, 'the build sandbox had the build\'s memory')
    const info = await sbx.getInfo()
    assert.equal(info.cpuCount, 1)
    assert.equal(info.memoryMB, 1024)

    // Harbor's upload_dir: files.write with a list.
    await sbx.files.write([
      { path: '/home/agent/up/a.txt', data: 'A' },
      { path: '/home/agent/up/sub/b.txt', data: new TextEncoder().encode('B') },
    ])
    assert.equal(await run(sbx, 'cat up/a.txt up/sub/b.txt', { cwd: '/home/agent' }), 'AB')
    assert.equal(await run(sbx, 'stat -c %U /home/agent/up/sub/b.txt'), 'agent', 'written as the default user')
    // Harbor's exec: a background command as a user, then wait.
    const h = await sbx.commands.run('id -un; pwd; echo "$X"', { background: true, user: 'root', cwd: '/task', envs: { X: 'y' }, timeoutMs: 0 })
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout.trim(), 'root\n/task\ny')
    await sbx.kill()
  })

  test("another key's template does not stand for FROM: the image is pulled (through the mirror)", TS, async () => {
    const other = process.env.OTHER_TEMPLATE
    assert.equal(await Template.exists(other), true, "another key's template exists for every key (sandboxes may start from it)")
    const name = `${prefix}-other`
    const { logs } = await build(Template().fromDockerfile(`FROM ${other}\nRUN test -f /${process.env.LAYER2_FILE}`), name)
    assert.ok(!logs.some((l) => l.includes('on this server')), `FROM ${other} did not use the other key's template:\n${logs.join('\n')}`)
    const sbx = await Sandbox.create(name)
    boxes.push(sbx)
    assert.equal(await sbx.files.read(`/${process.env.LAYER2_FILE}`), process.env.LAYER2_CONTENT, 'the image was pulled')
    await sbx.kill()
  })

  test("a build's cpuCount above the server's maximum fails the build", TS, async () => {
    const t = Template().fromDockerfile(`FROM ${process.env.BUSYBOX_TEMPLATE}\nRUN true`)
    await assert.rejects(Template.build(t, `${prefix}-big`, { cpuCount: 64 }), (err) => {
      assert.ok(err instanceof BuildError, `want BuildError, got ${err}`)
      assert.match(err.message, /cpuCount 64 is more than this server gives a build/)
      return true
    })
  })
})
