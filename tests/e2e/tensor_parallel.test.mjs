// tensor_parallel.test.mjs - one model across engine ranks (--tensor-parallel-size): every
// fixture model (the mixture of experts with its experts split by rank) gives, at TP=2 on the
// CPU, the greedy continuations Hugging Face computed (the TP=1 answers), text and image cases,
// alone and all at once; the log-probabilities are TP=1's within 1e-4; preempted requests
// finish as they do alone; /health, /metrics and /memory_stats show each rank. Models that do
// not divide are refused at start with the reason.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { FIXTURES, startServer, stopServer, postJson, getJson, makeDecoder, runToExit, waitFor } from './harness.mjs';

const dataUri = (bytes) => `data:image/png;base64,${Buffer.from(bytes).toString('base64')}`;

// A reference case as a request: text cases from their ids (completions), image cases as the
// chat the reference rendered (Qwen2-VL's: the case's image then its question).
function caseRequest(dir, c, extra = {}) {
  const common = { max_tokens: c.greedy_continuation.length, temperature: 0, ...extra };
  if (c.image && !c.images)
    return ['chat/completions', { ...common, messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: dataUri(readFileSync(`${dir}/${c.image}`)) } },
      { type: 'text', text: 'What is in this image?' }] }] }];
  if (c.images)
    return ['chat/completions', { ...common, messages: c.messages.map((m) => ({ role: m.role,
      content: typeof m.content === 'string' ? m.content : m.content.map((p) => (p.type === 'image'
        ? { type: 'image_url', image_url: { url: dataUri(readFileSync(`${dir}/${p.image}`)) } }
        : { type: 'text', text: p.text })) })) }];
  return ['completions', { ...common, prompt: c.input_ids }];
}

const textOf = (body) => body.choices[0].text ?? body.choices[0].message.content;

async function ask(server, dir, c, extra) {
  const [path, body] = caseRequest(dir, c, extra);
  const r = await postJson(`${server.url}/v1/${path}`, body, { timeoutMs: 60000 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body;
}

for (const name of ['qwen2', 'qwen2_vl', 'qwen2_5_vl', 'qwen3', 'qwen3_moe', 'qwen3_vl']) {
  test(`${name} at TP=2 gives the reference greedy continuations, alone and batched`, async () => {
    const dir = `${FIXTURES}/${name}`;
    const ref = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
    const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
    const server = await startServer(['--model', dir, '--port', '0', '--device', 'cpu',
      '--tensor-parallel-size', '2', '--vision-max-pixels', '71680']);
    try {
      const check = (c, body, i) => {
        assert.equal(textOf(body), decode(c.greedy_continuation), `case ${i}`);
        assert.equal(body.usage.prompt_tokens, c.input_ids.length, `case ${i}: prompt tokens`);
      };
      for (const [i, c] of ref.cases.entries()) check(c, await ask(server, dir, c), i);
      const together = await Promise.all(ref.cases.map((c) => ask(server, dir, c)));
      ref.cases.forEach((c, i) => check(c, together[i], i));
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });
}

test('TP=2 log-probabilities are TP=1\'s within 1e-4 (text and image cases)', async () => {
  const dir = `${FIXTURES}/qwen2_vl`;
  const ref = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
  const answers = [];
  for (const tp of ['1', '2']) {
    const server = await startServer(['--model', dir, '--port', '0', '--device', 'cpu',
      '--tensor-parallel-size', tp]);
    try {
      answers.push(await Promise.all(ref.cases.map((c) => ask(server, dir, c,
        { logprobs: c.image ? true : 5, top_logprobs: c.image ? 5 : undefined }))));
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  }
  // completions: top_logprobs maps; chat: content[].top_logprobs lists
  const tops = (body) => (body.choices[0].logprobs.content
    ? body.choices[0].logprobs.content.map((t) => t.top_logprobs.map((x) => [x.token, x.logprob]))
    : body.choices[0].logprobs.top_logprobs.map((m) => Object.entries(m)));
  let compared = 0, worst = 0;
  ref.cases.forEach((c, i) => {
    const [one, two] = [tops(answers[0][i]), tops(answers[1][i])];
    assert.equal(one.length, c.greedy_continuation.length);
    assert.equal(two.length, one.length, `case ${i}: as many tokens`);
    one.forEach((row, t) => row.forEach(([token, lp], k) => {
      assert.equal(two[t][k][0], token, `case ${i} token ${t}: alternative ${k}`);
      const diff = Math.abs(two[t][k][1] - lp);
      worst = Math.max(worst, diff);
      assert.ok(diff <= 1e-4, `case ${i} token ${t} alternative ${k}: ${two[t][k][1]} vs ${lp}`);
      compared++;
    }));
  });
  console.log(`compared ${compared} log-probabilities; largest difference ${worst}`);
});

test('TP=2: preempted requests finish as they do alone; every rank in /health, /metrics, /memory_stats', async () => {
  const server = await startServer(['--model', `${FIXTURES}/qwen2`, '--port', '0', '--device', 'cpu',
    '--tensor-parallel-size', '2', '--max-total-token-num', '320', '--max-model-len', '256',
    '--max-num-seqs', '16', '--admission-output-fraction', '0.1', '--heartbeat-ms', '50']);
  try {
    const health = (await getJson(`${server.url}/health`)).body;
    const ranks = health.processes.filter((p) => p.role === 'llm');
    assert.deepEqual(ranks.map((p) => [p.rank, p.state]), [[0, 'ready'], [1, 'ready']]);
    assert.notEqual(ranks[0].pid, ranks[1].pid);
    assert.equal(ranks[1].config['tensor-parallel-size'], '2');
    assert.equal(ranks[1].config.rank, '1');

    const prompts = Array.from({ length: 16 }, (_, i) => `Request ${i}: ${'tell me more '.repeat(1 + (i % 4))}`);
    const one = (prompt) => postJson(`${server.url}/v1/completions`, { prompt, max_tokens: 40, temperature: 0 },
      { timeoutMs: 120000 });
    const alone = [];
    for (const p of prompts) alone.push(await one(p));
    const together = await Promise.all(prompts.map(one));
    together.forEach((r, i) => {
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.choices[0].text, alone[i].body.choices[0].text, `request ${i}`);
    });
    const metrics = await waitFor('preemptions counted', async () => {
      const t = await (await fetch(`${server.url}/metrics`)).text();
      return /vlmd_llm_preemptions_total\{rank="0"\} [1-9]/.test(t) && t;
    }, 10000);
    assert.match(metrics, /vlmd_llm_up\{rank="0"\} 1\nvlmd_llm_up\{rank="1"\} 1\n/);
    assert.equal(metrics.match(/^# TYPE vlmd_llm_up /mg).length, 1, 'one TYPE line for the ranks');
    assert.doesNotMatch(metrics, /engine="1"/, 'a rank is not an engine to the gateways');
    const mem = (await getJson(`${server.url}/memory_stats`)).body;
    assert.equal(mem.llm.kv_capacity_tokens, 320);
    assert.equal(mem['llm-1'].state, 'ready');
    assert.equal(mem['llm-1'].kv_capacity_tokens, 320, 'rank 1 holds a cache of the same tokens');
    assert.ok(mem['llm-1'].reserved_bytes > 0 && mem['llm-1'].reserved_bytes < mem.llm.reserved_bytes,
      'rank 1 holds its share of the weights and its cache (rank 0 also the canary)');
    assert.equal(mem.llm.counters.device_allocations_since_ready, 0);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('models whose heads, width or experts do not divide by the ranks are refused at start, saying why', async () => {
  const three = await runToExit(['serve', '--model', `${FIXTURES}/qwen2`, '--port', '0', '--device', 'cpu',
    '--tensor-parallel-size', '3'], 60000);
  // the launcher stops (exit 1) on its engine's configuration error (exit 2)
  assert.equal(three.code, 1, three.stderr.slice(-2000));
  assert.match(three.stderr, /num_attention_heads 4 and intermediate_size 256 must both be multiples of the tensor-parallel size 3/);
  assert.match(three.stderr, /vlmd-llm exited with a configuration error; stopping the server/);
  const moe = await runToExit(['serve', '--model', `${FIXTURES}/qwen3_moe`, '--port', '0', '--device', 'cpu',
    '--tensor-parallel-size', '3'], 60000);
  assert.equal(moe.code, 1, moe.stderr.slice(-2000));
  assert.match(moe.stderr, /its 8 experts must be a multiple of the tensor-parallel size 3/);
  const rank = await runToExit(['serve', '--model', `${FIXTURES}/qwen2`, '--tensor-parallel-size', '2',
    '--rank', '1']);
  assert.equal(rank.code, 2);
  assert.match(rank.stderr, /--rank 1: vlmd serve gives each engine process its own rank/);
});
