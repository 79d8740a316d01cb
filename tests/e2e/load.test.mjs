// load.test.mjs - a bounded load on loopback: 2000 requests at 64 at a time
// against the CPU demo model. Every one succeeds, and no process's memory
// grows after the warm-up (resident set sampled from /proc).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { BIN, startServer, stopServer, postJson, getJson } from './harness.mjs';

const TOTAL = 2000, CONCURRENCY = 64, WARMUP = 400;
const GROWTH_LIMIT_KB = 16 * 1024;

const rssKb = (pid) => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]);

test(`${TOTAL} requests at ${CONCURRENCY} concurrency: no failure, no memory growth`, async () => {
  const model = mkdtempSync(`${tmpdir()}/vlmd-demo-`);
  execFileSync(`${BIN}/vlmd-make-demo-model`, [model]);
  // The KV cache (host memory on the CPU backend) becomes resident as its slots
  // are first used, and the prefix cache keeps using new ones: a 4096-token
  // cache is all touched during the warm-up, so what grows after it is a leak.
  // Sanitizer builds keep freed memory in quarantine: a small one keeps RSS honest.
  const server = await startServer(['--model', model, '--port', '0', '--visual-batch-size', '1',
    '--vision-max-pixels', '200704', '--max-total-token-num', '4096'],
    { readyTimeoutMs: 120000, env: { ASAN_OPTIONS: 'quarantine_size_mb=4' } });
  try {
    const pids = (await getJson(`${server.url}/health`)).body.processes.map((p) => [p.role, p.pid]);
    let next = 0, failures = 0, done = 0, before = null;
    const t0 = Date.now();
    const worker = async () => {
      while (next < TOTAL) {
        const i = next++;
        const r = await postJson(`${server.url}/v1/completions`,
          { prompt: `load test request ${i % 97}`, max_tokens: 8, temperature: 0.7, seed: i }, { timeoutMs: 60000 })
          .catch((e) => ({ status: e.message }));
        if (r.status !== 200) failures++;
        if (++done === WARMUP) before = pids.map(([role, pid]) => [role, rssKb(pid)]);
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    const seconds = (Date.now() - t0) / 1000;
    assert.equal(failures, 0, 'every request succeeded');
    const after = pids.map(([role, pid]) => [role, rssKb(pid)]);
    console.log(`${TOTAL} requests in ${seconds.toFixed(1)} s (${(TOTAL / seconds).toFixed(0)}/s); RSS kB after warm-up`,
      JSON.stringify(before), 'at the end', JSON.stringify(after));
    after.forEach(([role, kb], i) =>
      assert.ok(kb - before[i][1] < GROWTH_LIMIT_KB, `${role}: ${before[i][1]} kB -> ${kb} kB`));
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
