// The acceptance script of dsec's E2B-compatible API: only calls of the
// real, unmodified e2b SDK. Run by e2b_test.go with E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY and DSEC_E2B_TEMPLATE set. It prints one
// JSON line {"ok":true,"sandboxes":[ids]} at the end, or exits non-zero
// with the failed check on stderr.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

const template = process.env.DSEC_E2B_TEMPLATE
assert.ok(template, 'DSEC_E2B_TEMPLATE is required')

const created = []
const step = (name) => process.stderr.write(`-- ${name}\n`)

async function main() {
  step('create')
  const sbx = await Sandbox.create(template, {
    timeoutMs: 120_000,
    metadata: { suite: 'dsec-e2b' },
    envs: { GREETING: 'hello-env' },
  })
  created.push(sbx.sandboxId)
  assert.match(sbx.sandboxId, /^[a-z0-9_-]+$/)

  step('info and list')
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.suite, 'dsec-e2b')
  assert.equal(info.state, 'running')
  const listed = await Sandbox.list({ query: { metadata: { suite: 'dsec-e2b' } } }).nextItems()
  assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), 'the sandbox is listed by its metadata')
  assert.ok(await sbx.isRunning(), 'isRunning')

  step('commands: stdout, stderr, exit code, env')
  const out = await sbx.commands.run('echo out; echo err >&2; echo "$GREETING"')
  assert.equal(out.exitCode, 0)
  assert.equal(out.stdout, 'out\nhello-env\n')
  assert.equal(out.stderr, 'err\n')

  step('commands: streamed output callbacks, cwd and per-command envs')
  const chunks = []
  const cb = await sbx.commands.run('pwd; echo "$X"', { cwd: '/workspace', envs: { X: 'per-cmd' }, onStdout: (d) => chunks.push(d) })
  assert.equal(cb.stdout, '/workspace\nper-cmd\n')
  assert.equal(chunks.join(''), cb.stdout)

  step('commands: a failing command')
  await assert.rejects(sbx.commands.run('echo failing >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError, `want CommandExitError, got ${err}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stderr, 'failing\n')
    return true
  })
  await assert.rejects(sbx.commands.run('/no/such/binary'), (err) => err instanceof CommandExitError && err.exitCode === 127)

  step('commands: background command, list, kill')
  let sawStart
  const started = new Promise((resolve) => { sawStart = resolve })
  const bg = await sbx.commands.run('echo started; sleep 600', { background: true, onStdout: (d) => d.includes('started') && sawStart() })
  assert.ok(bg.pid > 0)
  await started
  let procs = await sbx.commands.list()
  assert.ok(procs.some((p) => p.pid === bg.pid && p.cmd === '/bin/bash' && p.args.includes('echo started; sleep 600')), `running processes: ${JSON.stringify(procs)}`)
  assert.equal(await sbx.commands.kill(bg.pid), true)
  await assert.rejects(bg.wait(), (err) => err instanceof CommandExitError && err.exitCode !== 0)
  assert.equal(bg.stdout, 'started\n')
  procs = await sbx.commands.list()
  assert.ok(!procs.some((p) => p.pid === bg.pid), 'the killed command is gone')
  assert.equal(await sbx.commands.kill(bg.pid), false, 'killing it again finds nothing')

  step('commands: stdin')
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'to stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const catRes = await cat.wait()
  assert.equal(catRes.stdout, 'to stdin\n')

  step('files: text and binary, write and read')
  await sbx.files.write('/workspace/hello.txt', 'hello, sandbox\n')
  assert.equal(await sbx.files.read('/workspace/hello.txt'), 'hello, sandbox\n')
  const bin = new Uint8Array(70_000)
  for (let i = 0; i < bin.length; i++) bin[i] = (i * 7 + 3) % 256
  await sbx.files.write('/workspace/deep/dir/blob.bin', bin.buffer)
  const back = await sbx.files.read('/workspace/deep/dir/blob.bin', { format: 'bytes' })
  assert.equal(back.length, bin.length)
  assert.ok(Buffer.from(back).equals(Buffer.from(bin)), 'binary round trip')
  const seen = await sbx.commands.run('wc -c < /workspace/deep/dir/blob.bin; cat /workspace/hello.txt')
  assert.equal(seen.stdout.trim().split('\n')[0].trim(), String(bin.length))
  await sbx.files.write([
    { path: '/workspace/multi/a.txt', data: 'A' },
    { path: '/workspace/multi/b.txt', data: 'B' },
  ])
  assert.equal(await sbx.files.read('/workspace/multi/b.txt'), 'B')
  await assert.rejects(sbx.files.read('/workspace/none.txt'), (err) => err instanceof NotFoundError)

  step('files: list, make and remove a directory')
  const entries = await sbx.files.list('/workspace')
  const names = entries.map((e) => e.name).sort()
  for (const n of ['README', 'deep', 'hello.txt', 'multi']) assert.ok(names.includes(n), `${n} in ${names}`)
  assert.equal(entries.find((e) => e.name === 'deep').type, 'dir')
  assert.equal(entries.find((e) => e.name === 'hello.txt').type, 'file')
  assert.equal(await sbx.files.makeDir('/workspace/newdir/sub'), true)
  assert.equal(await sbx.files.makeDir('/workspace/newdir/sub'), false, 'makeDir of an existing dir')
  assert.equal(await sbx.files.exists('/workspace/newdir/sub'), true)
  const st = await sbx.files.getInfo('/workspace/newdir')
  assert.equal(st.type, 'dir')
  await sbx.files.rename('/workspace/hello.txt', '/workspace/newdir/hello.txt')
  assert.equal(await sbx.files.read('/workspace/newdir/hello.txt'), 'hello, sandbox\n')
  await sbx.files.remove('/workspace/newdir')
  assert.equal(await sbx.files.exists('/workspace/newdir'), false)

  step('timeout')
  await sbx.setTimeout(300_000)
  const after = await sbx.getInfo()
  const left = after.endAt.getTime() - Date.now()
  assert.ok(left > 250_000 && left <= 301_000, `endAt ${after.endAt.toISOString()} is ${left} ms away`)

  step('connect')
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('echo connected')).stdout, 'connected\n')

  step('network: an egress allow list becomes dsec rules')
  const netSbx = await Sandbox.create(template, { timeoutMs: 60_000, network: { allowOut: ['192.0.2.1'] } })
  created.push(netSbx.sandboxId)
  const netInfo = await netSbx.getInfo()
  assert.deepEqual(netInfo.network?.allowOut, ['192.0.2.1/32'], `network: ${JSON.stringify(netInfo.network)}`)
  assert.equal(netInfo.allowInternetAccess, false)
  const links = (await netSbx.commands.run('ls /sys/class/net')).stdout.split(/\s+/).filter(Boolean)
  assert.ok(links.length > 1, `the allow list gave the sandbox a link besides lo: ${links}`)
  await netSbx.kill()
  await assert.rejects(Sandbox.create(template, { network: { allowOut: ['example.com'] } }), (err) => /domain names/.test(err.message))

  step('a second sandbox, killed by id')
  const other = await Sandbox.create(template, { timeoutMs: 60_000 })
  created.push(other.sandboxId)
  assert.equal((await other.commands.run('hostname >/dev/null; echo other')).stdout, 'other\n')
  assert.equal(await Sandbox.kill(other.sandboxId), true)
  assert.equal(await Sandbox.kill(other.sandboxId), false, 'killing it again finds nothing')

  step('kill')
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  const rest = await Sandbox.list().nextItems()
  assert.ok(!rest.some((s) => created.includes(s.sandboxId)), 'killed sandboxes are not listed')
}

try {
  await main()
  console.log(JSON.stringify({ ok: true, sandboxes: created }))
} catch (err) {
  console.error(err && err.stack ? err.stack : err)
  console.log(JSON.stringify({ ok: false, sandboxes: created }))
  process.exit(1)
}
