// memory.test.mjs - overload turns into waiting and preemption, never a
// failure: 64 concurrent requests that need ten times the KV cache all finish
// with the tokens each produces alone (greedy), preemptions show in /metrics,
// no request is lost, no process restarts, and no device memory is allocated
// after start-up. /memory_stats shows the auto-profile's numbers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FIXTURES, startServer, stopServer, postJson, getJson, waitFor } from './harness.mjs';

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
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-total-token-num', String(KV),
    '--max-model-len', '512', '--max-num-seqs', '64', '--admission-output-fraction', '0.1',
    '--heartbeat-ms', '50']);
  try {
    const prompts = Array.from({ length: 64 }, (_, i) => `Request ${i}: ${'tell me more '.repeat(1 + (i % 5))}`);
    const ask = (prompt) => postJson(`${server.url}/v1/completions`,
      { prompt, max_tokens: 90, temperature: 0 }, { timeoutMs: 120000 });
    const alone = [];
    for (const p of prompts) alone.push(await ask(p));
    const demand = alone.reduce((s, r) => s + r.body.usage.total_tokens, 0);
    assert.ok(demand >= 10 * KV, `the demand (${demand} tokens) is ten times the cache`);

    const together = await Promise.all(prompts.map(ask));
    together.forEach((r, i) => {
      assert.equal(r.status, 200, `request ${i}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.choices[0].text, alone[i].body.choices[0].text, `request ${i}: the same text`);
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

test('the auto-profile sizes the cache from the device and /memory_stats shows its phases', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--cpu-device-mb', '512',
    '--max-model-len', '1024']);
  try {
    const mem = (await getJson(`${server.url}/memory_stats`)).body.llm.memory;
    const total = 512 * 1024 * 1024;
    assert.equal(mem.device_total_bytes, total);
    assert.equal(mem.probe_tokens, 8192);
    const budget = Math.floor((total - mem.non_kv_peak_bytes - mem.peer_bytes - mem.canary_bytes) * 0.95);
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

test('a configuration the device cannot hold stops with every knob named', async () => {
  const { runToExit } = await import('./harness.mjs');
  // 270 MiB: the weights, the probe and the 256 MiB canary leave no room for a 4096-token request
  const r = await runToExit(['serve', '--model', MODEL, '--port', '0', '--cpu-device-mb', '270',
    '--max-model-len', '4096'], 60000);
  assert.equal(r.code, 1, r.stderr.slice(-2000)); // the launcher stops: a worker's configuration error
  for (const knob of ['--max-total-token-num', '--mem-fraction', '--max-num-seqs', '--batch-max-tokens',
    '--max-model-len', '--visual-batch-size', '--max-image-pixels'])
    assert.ok(r.stderr.includes(knob), `${knob} is named:\n${r.stderr.slice(-2000)}`);
});
