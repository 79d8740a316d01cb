// memory.test.mjs - overload turns into waiting and preemption, never a
// failure: 64 concurrent requests that need ten times the KV cache all finish
// with the tokens and logprobs each produces alone (greedy, bit for bit: the
// CPU backend's recomputation is its decode's arithmetic), preemptions show in
// /metrics, no request is lost, no process restarts, and no device memory is allocated
// after start-up. The router's book of the KV at the engine, which admission
// uses, is never below the engine's own figure. /memory_stats shows the
// auto-profile's numbers. The fit before the probe: a model whose own length
// cannot fit the device starts with the length that does (in /health,
// /v1/models and held to), a given --max-model-len that cannot fit stops at
// once with the numbers, and a frontend that does not know the engine's
// length yet admits nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, readdirSync, symlinkSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, FIXTURES, startServer, stopServer, postJson, getJson, waitFor, runToExit, sleep } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const KV = 640;

function metric(text, name) {
  const line = text.split('\n').find((l) => l.startsWith(name + '{') || l.startsWith(name + ' '));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

function metricsText(url) {
  return fetch(`${url}/metrics`).then((r) => r.text());
}

test('64 requests needing 10x the KV cache finish as they do alone, with preemptions', async () => {
  // admission counts a tenth of each max_tokens: it admits far more than fits,
  // and preemption takes care of the rest
  // the CPU backend, whose recomputation is bit-equal (docs/MEMORY.md §4; CUDA's is not promised)
  const server = await startServer(['--model', MODEL, '--port', '0', '--device', 'cpu',
    '--max-total-token-num', String(KV),
    '--max-model-len', '512', '--max-num-seqs', '64', '--admission-output-fraction', '0.1',
    '--heartbeat-ms', '50']);
  try {
    const prompts = Array.from({ length: 64 }, (_, i) => `Request ${i}: ${'tell me more '.repeat(1 + (i % 5))}`);
    const ask = (prompt) => postJson(`${server.url}/v1/completions`,
      { prompt, max_tokens: 90, temperature: 0, logprobs: 2 }, { timeoutMs: 120000 });
    const alone = [];
    for (const p of prompts) alone.push(await ask(p));
    const demand = alone.reduce((s, r) => s + r.body.usage.total_tokens, 0);
    assert.ok(demand >= 10 * KV, `the demand (${demand} tokens) is ten times the cache`);

    const together = await Promise.all(prompts.map(ask));
    together.forEach((r, i) => {
      assert.equal(r.status, 200, `request ${i}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.choices[0].text, alone[i].body.choices[0].text, `request ${i}: the same text`);
      // recomputed tokens are the same bits as decoded ones (docs/MEMORY.md §4): the logprobs too
      assert.deepEqual(r.body.choices[0].logprobs, alone[i].body.choices[0].logprobs,
        `request ${i}: the same logprobs`);
      assert.equal(r.body.choices[0].finish_reason, alone[i].body.choices[0].finish_reason);
    });

    // the counters travel in heartbeats and snapshots: wait for the ones after the last request
    await waitFor('the last counters', async () =>
      (await getJson(`${server.url}/memory_stats`)).body.router.counters.requests_admitted_total === 128, 10000);
    const text = await waitFor('preemptions in /metrics', async () => {
      const t = await metricsText(server.url);
      return metric(t, 'vlmd_llm_preemptions_total') > 0 && t;
    }, 10000);
    assert.ok(metric(text, 'vlmd_llm_preemptions_total') > 0, 'preemptions happened and are counted');
    console.log('preemptions:', metric(text, 'vlmd_llm_preemptions_total'), 'demand:', demand);
    for (const role of ['router', 'frontend', 'visual', 'llm'])
      assert.equal(metric(text, `vlmd_${role}_restarts_total`), 0, `${role} never restarted`);
    assert.equal(metric(text, 'vlmd_llm_device_allocations_since_ready'), 0, 'no device allocation after ready');
    assert.ok(text.includes('vlmd_requests_finished_total{model="qwen2",finished_reason="error"} 0'),
      'no request failed');

    const mem = (await getJson(`${server.url}/memory_stats`)).body;
    assert.equal(mem.llm.kv_capacity_tokens, KV);
    assert.equal(mem.llm.memory.kv_capacity_tokens, KV);
    assert.equal(mem.llm.memory.attempts, 1, '--max-total-token-num: one validation');
    assert.ok(mem.llm.memory.weights_bytes > 0 && mem.llm.memory.canary_bytes === 256 * 1024 * 1024);
    assert.equal(mem.llm.counters.device_allocations_since_ready, 0);
    assert.equal(mem.router.counters.requests_admitted_total, 128);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test("the router's KV book bounds the engine's own figure while requests run", async () => {
  // two books on purpose (router/requests.c, kv_in_use): admission decides at once on the
  // router's; the engine's arrives a heartbeat late and counts a shared prefix once
  const N = 4;
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-total-token-num', '4096',
    '--max-model-len', '1024', '--max-num-seqs', String(N), '--heartbeat-ms', '20']);
  try {
    let done = false;
    const asks = Array.from({ length: N }, (_, i) => postJson(`${server.url}/v1/completions`,
      { prompt: `Book ${i}: ${'count on '.repeat(4 + i)}`, max_tokens: 900, ignore_eos: true, temperature: 0 },
      { timeoutMs: 120000 }));
    const all = Promise.all(asks).finally(() => { done = true; });
    let compared = 0;
    while (!done) {
      const mem = (await getJson(`${server.url}/memory_stats`)).body;
      const router = mem.router.counters, engine = mem.llm.kv_used_tokens;
      // one snapshot: every request still at the engine when the engine measured, as it sends
      // a request's last chunk before the heartbeat that no longer counts it
      if (router.requests_at_engine === N && engine > 0) {
        assert.ok(engine <= router.kv_tokens_at_engine,
          `the engine holds ${engine} tokens, the router's book says ${router.kv_tokens_at_engine}`);
        compared++;
      }
      await sleep(10);
    }
    for (const r of await all) assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(compared >= 3, `compared ${compared} snapshots with every request running`);
    await waitFor('both books empty', async () => {
      const mem = (await getJson(`${server.url}/memory_stats`)).body;
      return mem.llm.kv_used_tokens === 0 && mem.router.counters.kv_tokens_at_engine === 0;
    }, 10000);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('the auto-profile sizes the cache from the device and /memory_stats shows its phases', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--cpu-device-mb', '512',
    '--max-model-len', '1024']);
  try {
    const mem = (await getJson(`${server.url}/memory_stats`)).body.llm.memory;
    const total = 512 * 1024 * 1024;
    assert.equal(mem.device_total_bytes, total);
    assert.equal(mem.probe_tokens, 8192);
    // the engine's grammar cache is host memory, which is this device: its bound, a
    // sixteenth of what the device holds beyond the canary, is kept out of the KV budget
    assert.equal(mem.grammar_cache_bytes, (total - mem.canary_bytes) / 16);
    const budget = Math.floor((total - mem.non_kv_peak_bytes - mem.peer_bytes - mem.canary_bytes -
      mem.grammar_cache_bytes) * 0.95);
    assert.ok(Math.abs(mem.target_budget_bytes - budget) <= 1, `${mem.target_budget_bytes} vs ${budget}`);
    assert.equal(mem.target_tokens, Math.floor(mem.target_budget_bytes / mem.kv_bytes_per_token));
    assert.equal(mem.kv_capacity_tokens, mem.target_tokens);
    assert.equal(mem.attempts, 1);
    const r = await postJson(`${server.url}/v1/completions`, { prompt: 'hello', max_tokens: 4 });
    assert.equal(r.status, 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('a KV cache the device cannot hold stops with every knob named', async () => {
  // 270 MiB: the weights and the 256 MiB canary leave no room for 100000 tokens
  const r = await runToExit(['serve', '--model', MODEL, '--port', '0', '--cpu-device-mb', '270',
    '--max-total-token-num', '100000'], 60000);
  assert.equal(r.code, 1, r.stderr.slice(-2000)); // the launcher stops: a worker's configuration error
  for (const knob of ['--max-total-token-num', '--mem-fraction', '--max-num-seqs', '--batch-max-tokens',
    '--max-model-len', '--visual-batch-size', '--max-image-pixels'])
    assert.ok(r.stderr.includes(knob), `${knob} is named:\n${r.stderr.slice(-2000)}`);
});

// ---- the fit before the probe -------------------------------------------------------

const LONG = 1 << 20; // positions the fixture model claims: 1.5 GiB of KV at 1536 bytes a token

// The qwen2 fixture with max_position_embeddings LONG, in a directory of its own.
function longModel() {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-e2e-long-'));
  for (const f of readdirSync(MODEL))
    if (f !== 'config.json') symlinkSync(join(MODEL, f), join(dir, f));
  const config = JSON.parse(readFileSync(join(MODEL, 'config.json'), 'utf8'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, max_position_embeddings: LONG }));
  return dir;
}

test("the model's length that cannot fit is lowered to what does, shown and held to", async () => {
  const model = longModel();
  // a small step keeps the workspace small: beside the 256 MiB canary, about a thousand tokens fit
  const server = await startServer(['--model', model, '--port', '0', '--cpu-device-mb', '262',
    '--batch-max-tokens', '256', '--max-num-seqs', '8']);
  try {
    const llm = (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'llm');
    assert.equal(llm.config['max-model-len'], '0', 'the flag was not given');
    const len = Number(llm.config.max_model_len);
    assert.ok(len > 0 && len < LONG && len % 256 === 0, `the effective length: ${len}`);
    assert.match(llm.config.max_model_len_reason,
      new RegExp(`^lowered from the model's max_position_embeddings ${LONG} to what fits: `));
    assert.match(server.stderr, new RegExp(`max model length lowered from the model's ${LONG} to ${len}`));
    const mem = (await getJson(`${server.url}/memory_stats`)).body.llm.memory;
    assert.equal(mem.max_model_len, len);
    assert.ok(mem.kv_capacity_tokens >= len, 'the cache holds one request of it');
    assert.equal(mem.stress, 'shapes', "the CPU's stress is sized by the shapes");
    const models = (await getJson(`${server.url}/v1/models`)).body;
    assert.equal(models.data[0].max_model_len, len);
    assert.equal((await getJson(`${server.url}/v1/models/${models.data[0].id}`)).body.max_model_len, len);

    const past = await postJson(`${server.url}/v1/completions`, { prompt: Array(len).fill(7), max_tokens: 1 });
    assert.equal(past.status, 400, JSON.stringify(past.body));
    assert.equal(past.body.error.code, 'context_length_exceeded');
    assert.match(past.body.error.message, new RegExp(`maximum context length is ${len} tokens`));
    // within it: answered, the output shrunk to the room left
    const within = await postJson(`${server.url}/v1/completions`, { prompt: Array(len - 1).fill(7) },
      { timeoutMs: 60000 });
    assert.equal(within.status, 200, JSON.stringify(within.body));
    assert.equal(within.body.usage.completion_tokens, 1);
    assert.equal(within.body.choices[0].finish_reason, 'length');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    rmSync(model, { recursive: true, force: true });
  }
});

test('a given --max-model-len that cannot fit stops at once with the numbers', async () => {
  const model = longModel();
  try {
    const started = Date.now();
    const r = await runToExit(['serve', '--model', model, '--port', '0', '--cpu-device-mb', '300',
      '--max-model-len', String(LONG)], 60000);
    const seconds = (Date.now() - started) / 1000;
    assert.equal(r.code, 1, r.stderr.slice(-2000)); // the launcher stops: a worker's configuration error
    assert.match(r.stderr, /vlmd-llm exited with a configuration error/);
    const line = r.stderr.split('\n').find((l) => l.includes(`--max-model-len ${LONG} does not fit`));
    assert.ok(line, r.stderr.slice(-3000));
    for (const part of [`one request of ${LONG} tokens needs 1536 MiB of KV cache (1536 bytes per token)`,
      '300 MiB)', 'the canary (256 MiB)', '--mem-fraction 0.95', 'a larger --cpu-device-mb',
      '--batch-max-tokens', '--max-num-seqs', '--visual-batch-size'])
      assert.ok(line.includes(part), `'${part}' in: ${line}`);
    const fits = Number(line.match(/lower --max-model-len to (\d+) or less/)?.[1]);
    assert.ok(fits > 0 && fits < LONG, line);
    assert.doesNotMatch(r.stderr, /profile: probe/, 'refused before the probe');
    assert.doesNotMatch(r.stderr, /loaded in/, 'and before the weights are loaded');
    console.log(`refused in ${seconds.toFixed(2)} s; at most ${fits} tokens fit`);
  } finally {
    rmSync(model, { recursive: true, force: true });
  }
});

// The arguments vlmd-ROLE gets (`vlmd args` quotes each one for a shell).
function roleArgs(role, flags) {
  const line = execFileSync(`${BIN}/vlmd`, ['args', role, ...flags], { encoding: 'utf8' }).trim();
  return line.match(/'[^']*'/g).map((a) => a.slice(1, -1));
}

test('a frontend that does not know the engine\'s length yet admits nothing', async () => {
  // router and frontend only: no engine has said what length it serves
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-e2e-nolen-'));
  const flags = ['--model', MODEL, '--router-endpoint', `ipc://${dir}/router.sock`,
    '--embed-arena-path', `${dir}/arena`, '--port', '0', '--heartbeat-ms', '50'];
  const procs = ['router', 'frontend'].map((role) => {
    const child = spawn(`${BIN}/vlmd-${role}`, roleArgs(role, flags), { stdio: ['ignore', 'ignore', 'pipe'] });
    const p = { role, child, stderr: '', exited: null };
    child.stderr.on('data', (d) => { p.stderr += d; });
    child.on('exit', (code, signal) => { p.exited = { code, signal }; });
    return p;
  });
  try {
    const url = await waitFor('the frontend to listen', () => {
      if (procs[1].exited) throw new Error(`the frontend exited: ${procs[1].stderr}`);
      return procs[1].stderr.match(/listening on (http:\/\/\S+)/)?.[1];
    });
    await waitFor('a snapshot from the router', async () =>
      (await getJson(`${url}/health`)).body.processes.some((p) => p.role === 'router'));
    for (const path of ['/v1/completions', '/v1/chat/completions']) {
      const r = await postJson(`${url}${path}`, path.includes('chat')
        ? { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 } : { prompt: 'hi', max_tokens: 1 });
      assert.equal(r.status, 503, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'engine_not_ready');
      assert.equal(r.headers['retry-after'], '1');
    }
  } finally {
    for (const p of [...procs].reverse()) {
      if (!p.exited) p.child.kill('SIGTERM');
      await waitFor(`${p.role} to exit`, () => p.exited, 20000);
      assert.deepEqual(p.exited, { code: 0, signal: null }, `${p.role}: ${p.stderr.slice(-2000)}`);
    }
    rmSync(dir, { recursive: true, force: true });
  }
});
