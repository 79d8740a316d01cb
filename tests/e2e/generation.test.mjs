// generation.test.mjs - text generated through the four processes: the
// frontend tokenizes, the router routes, the engine generates, the frontend
// detokenizes. Checked against the greedy continuations Hugging Face
// transformers computed for the fixture model (and, for Qwen3 and
// Qwen3-MoE, the validated port of its code computed for theirs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { FIXTURES, startServer, stopServer, postJson, getJson, makeDecoder } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const reference = JSON.parse(readFileSync(`${MODEL}/reference.json`, 'utf8'));
const decode = makeDecoder(JSON.parse(readFileSync(`${MODEL}/tokenizer.json`, 'utf8')));

test('greedy completions through the processes match the reference', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0']);
  try {
    for (const c of reference.cases) {
      const want = c.greedy_continuation;
      // the ids HF fed (a prompt string's special tokens would be text)
      const { status, body } = await postJson(`${server.url}/v1/completions`, {
        prompt: c.input_ids, max_tokens: want.length, temperature: 0,
      }, { timeoutMs: 30000 });
      assert.equal(status, 200, JSON.stringify(body));
      assert.equal(body.object, 'text_completion');
      assert.equal(body.usage.prompt_tokens, c.input_ids.length);
      assert.equal(body.usage.completion_tokens, want.length);
      assert.equal(body.choices[0].finish_reason, 'length');
      assert.equal(body.choices[0].text, decode(want));
    }

    // Concurrent requests give what each gives alone (continuous batching).
    const prompts = Array.from({ length: 8 }, (_, i) => `Request number ${i}: ${'tell me more '.repeat(i + 1)}`);
    const ask = (prompt, i) => postJson(`${server.url}/v1/completions`, {
      prompt, max_tokens: 6 + i, temperature: i % 2 ? 0.8 : 0, seed: 100 + i,
    }, { timeoutMs: 30000 });
    const alone = [];
    for (const [i, p] of prompts.entries()) alone.push((await ask(p, i)).body.choices[0].text);
    const together = await Promise.all(prompts.map((p, i) => ask(p, i)));
    assert.deepEqual(together.map((r) => r.body.choices[0].text), alone);

    // A prompt too long for the model: a 400 that says so, and the server keeps serving.
    const long = await postJson(`${server.url}/v1/completions`, { prompt: Array(5000).fill(7), max_tokens: 1 });
    assert.equal(long.status, 400);
    assert.equal(long.body.error.param, 'prompt');
    const bad = await postJson(`${server.url}/v1/completions`, { prompt: [[1, 'not an id']] });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, 'prompt');
    const health = await getJson(`${server.url}/health`);
    assert.equal(health.status, 200);
    const llm = health.body.processes.find((p) => p.role === 'llm');
    assert.equal(llm.config['enforce-eager'], 'false');
    assert.equal(llm.config.cuda_graphs, 'off (the cpu backend has none)', 'the effective setting');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('--enforce-eager and the CUDA kernels\' ways show in /health', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--enforce-eager',
    '--cuda-attention', 'wmma', '--cuda-decode-attention', 'cores', '--cuda-pdl', 'on']);
  try {
    const llm = (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'llm');
    assert.equal(llm.config['enforce-eager'], 'true');
    assert.equal(llm.config.cuda_graphs, 'off (--enforce-eager)');
    assert.equal(llm.config['cuda-attention'], 'wmma');
    assert.equal(llm.config['cuda-decode-attention'], 'cores');
    assert.equal(llm.config['cuda-decode-linear'], 'cublas');
    assert.equal(llm.config['cuda-pdl'], 'on');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

// The Qwen3 generation's text models, dense and mixture of experts: each case's ids give its
// greedy continuation, alone and with every case in flight at once.
for (const name of ['qwen3', 'qwen3_moe']) {
  test(`${name}: greedy completions from the case ids match the reference`, async () => {
    const model = `${FIXTURES}/${name}`;
    const ref = JSON.parse(readFileSync(`${model}/reference.json`, 'utf8'));
    const decodeIds = makeDecoder(JSON.parse(readFileSync(`${model}/tokenizer.json`, 'utf8')));
    const server = await startServer(['--model', model, '--port', '0']);
    try {
      const ask = (c) => postJson(`${server.url}/v1/completions`, {
        prompt: c.input_ids, max_tokens: c.greedy_continuation.length, temperature: 0,
      }, { timeoutMs: 30000 });
      const check = (c, { status, body }) => {
        assert.equal(status, 200, JSON.stringify(body));
        assert.equal(body.usage.prompt_tokens, c.input_ids.length);
        assert.equal(body.usage.completion_tokens, c.greedy_continuation.length);
        assert.equal(body.choices[0].text, decodeIds(c.greedy_continuation));
      };
      for (const c of ref.cases) check(c, await ask(c));
      const together = await Promise.all(ref.cases.map(ask));
      ref.cases.forEach((c, i) => check(c, together[i]));
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });
}
