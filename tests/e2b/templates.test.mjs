// Templates defined in code, as E2B's JS SDK (2.51.0) builds them:
// Template().fromImage(…).runCmd(…).copy(…).setEnvs(…).setWorkdir(…)
// .setUser(…).setStartCmd(…, waitForFile(…)), then Template.build(t, alias)
// and Sandbox.create(alias). The Go test TestE2BTemplates
// (internal/server/e2b_templates_test.go) runs it against a server that
// may pull from a registry on loopback (go-containerregistry's, holding a
// two-layer GNU image the Go test pushed): E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY, TEMPLATE_IMAGE (that image's reference) and INET_PUBLIC,
// INET_PRIVATE (a fake internet's addresses, network_test.go) are set.
// copy() reads from this file's directory (the SDK's default context).

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

import { BuildError, Sandbox, Template, waitForFile } from 'e2b'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'TEMPLATE_IMAGE', 'INET_PUBLIC', 'INET_PRIVATE']) {
  if (!process.env[k]) throw new Error(`templates.test.mjs: set ${k}`)
}
const IMAGE = process.env.TEMPLATE_IMAGE
const TS = { timeout: 600_000 }
const alias = `tpl-${randomBytes(4).toString('hex')}`

// The template of the test; mark changes only the ENV step, so a second
// build reruns it and what follows, and finds the RUN and COPY cached.
const appTemplate = (mark) =>
  Template()
    .fromImage(IMAGE)
    // aptInstall-style: a root RUN that installs a tool (no network here;
    // the test image, unlike Debian's, has no /usr/local/bin).
    .runCmd(
      "mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho tool-ok\\n' > /usr/local/bin/mytool && chmod 755 /usr/local/bin/mytool",
      { user: 'root' },
    )
    .copy('fixtures/tpl-app', '/app')
    .setEnvs({ GREETING: 'hello', MARK: mark })
    .setWorkdir('/app')
    .setUser('app')
    .setStartCmd('echo "$GREETING" > /home/app/started; exec sleep 1000000', waitForFile('/home/app/started'))

async function build(t, name) {
  const logs = []
  const began = Date.now()
  try {
    const info = await Template.build(t, name, { onBuildLogs: (e) => logs.push(e.message) })
    return { info, logs, ms: Date.now() - began }
  } catch (err) {
    // The SDK's BuildError stack is the user's source line only: say why.
    console.log(`build of ${name} failed: ${err.message}\nits log:\n${logs.join('\n')}`)
    throw err
  }
}

async function run(sbx, cmd) {
  const r = await sbx.commands.run(cmd)
  assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`)
  return r.stdout.trim()
}

describe('templates in code through the e2b SDK', { concurrency: false }, () => {
  const boxes = []
  after(async () => {
    for (const b of boxes) await b.kill().catch(() => {})
  })

  test('build from an image, a sandbox sees every step, a rebuild reuses the cache', TS, async () => {
    const cold = await build(appTemplate('v1'), alias)
    assert.equal(cold.info.templateId, alias)
    assert.ok(cold.info.buildId, 'a build ID')
    assert.ok(cold.logs.some((l) => l.includes('[builder')), `the server's step log reaches onBuildLogs:\n${cold.logs.join('\n')}`)
    assert.equal(await Template.exists(alias), true)

    const sbx = await Sandbox.create(alias)
    boxes.push(sbx)
    assert.equal(await run(sbx, 'mytool'), 'tool-ok', 'RUN as root installed a tool')
    assert.equal(await sbx.files.read('/app/hello.txt'), 'hello from the build context\n', 'COPY of a folder')
    assert.equal(await sbx.files.read('/app/sub/nested.txt'), 'nested file\n', 'COPY keeps subfolders')
    assert.equal(await run(sbx, 'echo "$GREETING $MARK"'), 'hello v1', 'ENV')
    assert.equal(await run(sbx, 'pwd'), '/app', 'WORKDIR is the default cwd')
    assert.equal(await run(sbx, 'id -un'), 'app', 'USER is the default user')
    assert.equal(await run(sbx, 'cat /home/app/started'), 'hello', 'the start command ran, with the env')
    const procs = await run(sbx, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert.ok(procs.includes('sleep 1000000'), `the start command's process runs: ${procs}`)
    await sbx.kill()

    const cached = await build(appTemplate('v2'), alias)
    assert.equal(cached.info.templateId, alias, 'a rebuild of the alias is the same template')
    assert.ok(cached.logs.some((l) => l.includes('Skipping upload')), `the COPY files were kept for the template:\n${cached.logs.join('\n')}`)
    const hits = cached.logs.filter((l) => l.startsWith('CACHED '))
    assert.ok(hits.some((l) => l.includes(' RUN ')) && hits.some((l) => l.includes(' COPY ')),
      `the unchanged RUN and COPY steps were cached:\n${cached.logs.join('\n')}`)
    assert.ok(!cached.logs.some((l) => l.startsWith('CACHED ') && l.includes(' ENV ')), 'the changed ENV step ran again')
    console.log(`template build from ${IMAGE}: cold ${cold.ms} ms, with the RUN and COPY cached ${cached.ms} ms`)

    // Tags: the build got "default"; another tag names the same build,
    // and a sandbox starts from alias:tag.
    const assigned = await Template.assignTags(`${alias}:default`, 'prod')
    assert.equal(assigned.buildId, cached.info.buildId)
    assert.deepEqual((await Template.getTags(alias)).map((t) => t.tag).sort(), ['default', 'prod'])
    const sbx2 = await Sandbox.create(`${alias}:prod`)
    boxes.push(sbx2)
    assert.equal(await run(sbx2, 'echo "$GREETING $MARK"'), 'hello v2', 'the rebuilt template has the changed step')
    assert.equal(await sbx2.files.read('/app/hello.txt'), 'hello from the build context\n')
    await sbx2.kill()
    await Template.removeTags(alias, 'prod')
    assert.deepEqual((await Template.getTags(alias)).map((t) => t.tag), ['default'])
  })

  test('fromTemplate + copy stacks a thin layer on the template: its own bytes are the file', TS, async () => {
    const thin = `${alias}-thin`
    const built = await build(Template().fromTemplate(alias).copy('fixtures/tpl-app/hello.txt', '/task/task.txt'), thin)
    assert.equal(built.info.templateId, thin)
    const get = async (name) => {
      const res = await fetch(`${process.env.E2B_API_URL}/templates/${name}`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
      assert.equal(res.status, 200)
      return res.json()
    }
    const info = await get(thin)
    const base = await get(alias)
    assert.equal(info.layers, base.layers + 1, `a template on another is one layer more: ${JSON.stringify(info)}, on ${JSON.stringify(base)}`)
    assert.ok(info.ownBytes < 256 << 10 && info.sharedBytes > 4 * info.ownBytes,
      `its own bytes are about its file, the base's are shared: ${JSON.stringify(info)}`)
    const sbx = await Sandbox.create(thin)
    boxes.push(sbx)
    assert.equal(await sbx.files.read('/task/task.txt'), 'hello from the build context\n', 'the thin layer')
    assert.equal(await run(sbx, 'mytool'), 'tool-ok', "the base template's RUN step, below")
    await sbx.kill()
    await fetch(`${process.env.E2B_API_URL}/templates/${thin}`, { method: 'DELETE', headers: { 'X-API-Key': process.env.E2B_API_KEY } })
    console.log(`thin template on ${alias}: ${built.ms} ms, ${info.ownBytes} bytes of its own, ${info.sharedBytes} shared`)
  })

  test("the build's cpuCount and memoryMB are its sandboxes' defaults", TS, async () => {
    const name = `${alias}-sized`
    const logs = []
    await Template.build(Template().fromImage(IMAGE).runCmd('true'), name,
      { cpuCount: 1, memoryMB: 1024, onBuildLogs: (e) => logs.push(e.message) })
      .catch((err) => { console.log(`build of ${name} failed: ${err.message}\n${logs.join('\n')}`); throw err })
    const sbx = await Sandbox.create(name)
    boxes.push(sbx)
    assert.match(await run(sbx, 'grep MemTotal /proc/meminfo'), /^MemTotal:\s+1048576 kB$/, 'the sandbox has the build\'s memory')
    const info = await sbx.getInfo()
    assert.equal(info.cpuCount, 1)
    assert.equal(info.memoryMB, 1024)
    await sbx.kill()
  })

  test('a RUN step has a network slot with the default egress policy', TS, async () => {
    // INET_PUBLIC and INET_PRIVATE are host:port of an HTTP server in a
    // namespace the Go test made (its fake internet): the public address
    // must answer, the private one (RFC 1918) must be refused at once
    // (blocked traffic is rejected, not dropped). bash's /dev/tcp has no
    // timeout: a probe still connecting after 3 s is killed as hung.
    const [pubHost, pubPort] = process.env.INET_PUBLIC.split(':')
    const [privHost, privPort] = process.env.INET_PRIVATE.split(':')
    const probe = [
      `exec 3<>/dev/tcp/${pubHost}/${pubPort} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && echo "public: $(cat <&3 | tail -n 1)"`,
      `(exec 4<>/dev/tcp/${privHost}/${privPort} && echo 'private: open' || echo 'private: blocked') & p=$!; sleep 3; kill $p 2>/dev/null && echo 'private: hung'; true`,
    ].join('; ')
    const t = Template().fromImage(IMAGE).skipCache().runCmd(probe)
    const { logs } = await build(t, `${alias}-net`)
    assert.ok(logs.includes('public: hello from the fake internet'), `the public address answers:\n${logs.join('\n')}`)
    assert.ok(logs.includes('private: blocked') && !logs.includes('private: open') && !logs.includes('private: hung'),
      `the private address is refused at once:\n${logs.join('\n')}`)
  })

  test('a failing step throws BuildError with its index, command and output', TS, async () => {
    const t = Template()
      .fromImage(IMAGE)
      .runCmd('true')
      .runCmd('echo failing-output-marker; exit 3')
      .runCmd('echo never')
    await assert.rejects(build(t, `${alias}-bad`), (err) => {
      assert.ok(err instanceof BuildError, `want BuildError, got ${err}`)
      for (const want of ['step 2', 'exit 3', 'failing-output-marker']) {
        assert.ok(err.message.includes(want), `BuildError message lacks ${want}: ${err.message}`)
      }
      return true
    })
    assert.equal(await Template.exists(`${alias}-bad`), false, 'a failed build leaves no template')
  })
})
