// Benchmarks of the E2B path, unmodified SDK calls only (run by
// bench_test.go):
//   node bench.mjs exec N       N round trips of commands.run('true') in one
//                               sandbox; prints {"ns_per_op": ...}
//   node bench.mjs create N C   N sandboxes created C at a time (each
//                               wave's creates run concurrently), then
//                               killed; prints {"created": N, "seconds": ...}
import { Sandbox } from 'e2b'

const template = process.env.DSEC_E2B_TEMPLATE
const [mode, nArg, cArg] = process.argv.slice(2)
const n = Number(nArg)

async function execBench() {
  const sbx = await Sandbox.create(template, { timeoutMs: 600_000 })
  try {
    for (let i = 0; i < 3; i++) await sbx.commands.run('true') // warm up
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < n; i++) await sbx.commands.run('true')
    const ns = Number(process.hrtime.bigint() - t0)
    console.log(JSON.stringify({ ns_per_op: ns / n }))
  } finally {
    await sbx.kill()
  }
}

async function createBench() {
  const c = Number(cArg)
  const ids = []
  const t0 = process.hrtime.bigint()
  try {
    for (let done = 0; done < n; done += c) {
      const wave = await Promise.all(Array.from({ length: Math.min(c, n - done) }, () => Sandbox.create(template, { timeoutMs: 600_000 })))
      ids.push(...wave.map((s) => s.sandboxId))
    }
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9
    console.log(JSON.stringify({ created: ids.length, seconds }))
  } finally {
    await Promise.all(ids.map((id) => Sandbox.kill(id)))
  }
}

await (mode === 'exec' ? execBench() : createBench())
