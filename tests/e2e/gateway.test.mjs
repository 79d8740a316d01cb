// gateway.test.mjs - what the Kubernetes inference gateways read from vlmd:
// vLLM's gauges under load agree with the engine's state (running, waiting,
// KV ratio), the token counters and finish reasons add up to what the
// requests reported, and a full queue answers 503 with Retry-After at once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FIXTURES, startServer, stopServer, postJson, waitFor } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const LABELS = 'model_name="qwen2",engine="0"';

async function scrape(url) {
  const text = await fetch(`${url}/metrics`).then((r) => r.text());
  const value = (series) => {
    const line = text.split('\n').find((l) => l.startsWith(`${series} `));
    return line === undefined ? undefined : Number(line.slice(series.length + 1));
  };
  return { text, value };
}

test('under load the vLLM gauges count what the router and the engine hold', async () => {
  const N = 4;
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-num-seqs', '1',
    '--max-total-token-num', '16384', '--max-model-len', '1024', '--batch-max-tokens', '256',
    '--heartbeat-ms', '50'], { readyTimeoutMs: 120000 });
  try {
    let inFlight = N;
    const replies = Array.from({ length: N }, (_, i) =>
      postJson(`${server.url}/v1/completions`,
        { prompt: `gateway request ${i}`, max_tokens: 400, ignore_eos: true, temperature: 0 },
        { timeoutMs: 170000 }).finally(() => { inFlight--; }));
    // one runs (--max-num-seqs 1), the rest wait: in the router's queue or
    // at the engine unscheduled; a scrape agrees once the heartbeat and the
    // snapshot after it are both newer than the last change
    const seen = await waitFor('running 1 and waiting the rest', async () => {
      const before = inFlight;
      const m = await scrape(server.url);
      const running = m.value(`vllm:num_requests_running{${LABELS}}`);
      const waiting = m.value(`vllm:num_requests_waiting{${LABELS}}`);
      assert.ok(running <= 1, `never more running than --max-num-seqs: ${running}`);
      assert.ok(running + waiting <= N, `never more than were sent: ${running} + ${waiting}`);
      const usage = m.value(`vllm:kv_cache_usage_perc{${LABELS}}`);
      assert.equal(m.value(`vllm:gpu_cache_usage_perc{${LABELS}}`), usage, 'the old name says the same');
      assert.equal(usage.toFixed(6), m.value('vlmd_kv_cache_usage_ratio{rank="0"}').toFixed(6),
        'the KV ratio is the engine\'s');
      return before === inFlight && before >= 2 && running === 1 && waiting === before - 1 && usage > 0
        ? { running, waiting, usage } : false;
    }, 120000, 20);
    assert.equal(seen.running, 1);
    const done = await Promise.all(replies);
    for (const r of done) assert.equal(r.status, 200, JSON.stringify(r.body));
    const prompt = done.reduce((a, r) => a + r.body.usage.prompt_tokens, 0);
    const generated = done.reduce((a, r) => a + r.body.usage.completion_tokens, 0);
    assert.equal(generated, N * 400);
    // the engine's counters arrive with its next heartbeat
    await waitFor('idle gauges and the token counters', async () => {
      const m = await scrape(server.url);
      return m.value(`vllm:num_requests_running{${LABELS}}`) === 0 &&
        m.value(`vllm:num_requests_waiting{${LABELS}}`) === 0 &&
        m.value(`vllm:generation_tokens_total{${LABELS}}`) === generated &&
        m.value(`vllm:prompt_tokens_total{${LABELS}}`) === prompt;
    }, 20000);
    const m = await scrape(server.url);
    assert.equal(m.value(`vllm:request_success_total{${LABELS},finished_reason="length"}`), N);
    assert.equal(m.value(`vllm:e2e_request_latency_seconds_count{${LABELS}}`), N);
    assert.equal(m.value(`vllm:time_to_first_token_seconds_count{${LABELS}}`), N);
    assert.match(m.text, /^vllm:cache_config_info\{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="1024"\} 1$/m);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('a full queue answers 503 with Retry-After at once, and the others are served', async () => {
  // room for one request's KV at a time, and one more may wait for it
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-total-token-num', '512', '--max-model-len', '512',
    '--max-queued-requests', '1', '--batch-max-tokens', '256', '--heartbeat-ms', '50'],
    { readyTimeoutMs: 120000 });
  try {
    const replies = await Promise.all(Array.from({ length: 3 }, (_, i) =>
      postJson(`${server.url}/v1/completions`,
        { prompt: `queue ${i}`, max_tokens: 400, ignore_eos: true, temperature: 0 }, { timeoutMs: 170000 })));
    const statuses = replies.map((r) => r.status).sort();
    assert.deepEqual(statuses, [200, 200, 503], JSON.stringify(replies.map((r) => r.body)));
    const refused = replies.find((r) => r.status === 503);
    assert.equal(refused.headers['retry-after'], '1');
    assert.match(refused.body.error.message, /--max-queued-requests/);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
