// bench.test.mjs - vlmd-bench against a real server on loopback: the random
// dataset on both endpoints and a ShareGPT file give every request back with
// exactly its tokens (ignore_eos), metrics that hold together, and counts
// that agree with the server's own /metrics; chat prompts with random images
// reach a vision model's visual worker; failed requests make it exit 1.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { tmpdir } from 'node:os';
import { BIN, FIXTURES, startServer, stopServer, waitFor } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const dir = mkdtempSync(`${tmpdir()}/vlmd-bench-`);
let server;

before(async () => { server = await startServer(['--model', MODEL, '--port', '0']); });
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
});

async function bench(name, flags, { url = server.url, model = MODEL } = {}) {
  const json = `${dir}/${name}.json`;
  const run = await promisify(execFile)(`${BIN}/vlmd-bench`, ['--base-url', url,
    '--tokenizer', `${model}/tokenizer.json`, '--result-json', json, ...flags], { timeout: 120000 })
    .catch((e) => e);
  return { code: run.code ?? 0, stdout: run.stdout, stderr: run.stderr,
    result: run.code ? null : JSON.parse(readFileSync(json, 'utf8')) };
}

async function promptTokensServed() {
  const text = await fetch(`${server.url}/metrics`).then((r) => r.text());
  return Number(text.match(/^vlmd_prompt_tokens_total\{[^}]*\} (\d+)/m)[1]);
}

function holdsTogether(r, n) {
  assert.equal(r.completed, n);
  assert.equal(r.failed, 0);
  for (const m of ['ttft', 'tpot', 'itl', 'e2el']) {
    assert.ok(r[`mean_${m}_ms`] > 0, m);
    assert.ok(r[`p99_${m}_ms`] >= r[`median_${m}_ms`], `${m}: p99 >= median`);
  }
  assert.ok(r.p99_ttft_ms <= r.p99_e2el_ms, 'the first token comes before the last');
  assert.ok(Math.abs(r.request_throughput - n / r.duration) < 1e-6 * r.request_throughput);
  assert.ok(Math.abs(r.output_throughput - r.total_output_tokens / r.duration) < 1e-6 * r.output_throughput);
}

test('random prompts on /v1/completions: exact lengths, the server counts the same', async () => {
  const served = await promptTokensServed();
  const { code, stdout, stderr, result: r } = await bench('random', ['--num-prompts', '24',
    '--random-input-len', '48', '--random-output-len', '12', '--max-concurrency', '6']);
  assert.equal(code, 0, stderr);
  assert.match(stdout, /Serving Benchmark Result[\s\S]*Successful requests:\s+24/);
  holdsTogether(r, 24);
  assert.equal(r.total_input_tokens, 24 * 48, 'the ids are the prompt, token for token');
  assert.equal(r.total_output_tokens, 24 * 12, 'ignore_eos: every request runs to max_tokens');
  assert.equal(await promptTokensServed() - served, 24 * 48, "the server's /metrics agree");
});

test('chat at a Poisson request rate, and a ShareGPT file', async () => {
  const t0 = Date.now();
  const chat = await bench('chat', ['--endpoint', 'chat', '--num-prompts', '16',
    '--random-input-len', '24', '--random-output-len', '6', '--request-rate', '40', '--seed', '3']);
  assert.equal(chat.code, 0, chat.stderr);
  holdsTogether(chat.result, 16);
  assert.equal(chat.result.total_output_tokens, 16 * 6);
  assert.ok(chat.result.total_input_tokens > 16 * 24, 'the chat template adds its tokens');
  assert.ok(Date.now() - t0 > 150, 'arrivals were spread out (16 at 40/s)');

  const turns = (q, a) => ({ conversations: [{ from: 'human', value: q }, { from: 'gpt', value: a }] });
  writeFileSync(`${dir}/sharegpt.json`, JSON.stringify([
    turns('What is the capital of France, and why?', 'Paris is the capital of France.'),
    turns('Name three colors of the rainbow.', 'Red, orange and yellow are three of them.'),
    turns('Hi', 'Too short a question to be used.'),
    turns('How many legs does a spider have?', 'A spider has eight legs.')]));
  const sg = await bench('sharegpt', ['--dataset', 'sharegpt', '--dataset-path', `${dir}/sharegpt.json`,
    '--num-prompts', '3', '--ignore-eos', 'true']);
  assert.equal(sg.code, 0, sg.stderr);
  holdsTogether(sg.result, 3);
  assert.equal(sg.result.dataset, 'sharegpt');
});

test('refused requests are counted as failures and the exit code says so', async () => {
  const { code, stderr, stdout } = await bench('refused', ['--num-prompts', '2',
    '--random-input-len', '100000', '--random-output-len', '4']);
  assert.equal(code, 1);
  assert.match(stderr, /request 0 failed: HTTP 400/);
  assert.match(stdout, /Failed requests:\s+2/);
});

test('chat prompts with random images: each image is encoded by the visual worker', async () => {
  const model = `${FIXTURES}/qwen2_vl`;
  const vl = await startServer(['--model', model, '--port', '0']);
  try {
    const { code, stderr, result: r } = await bench('images', ['--endpoint', 'chat',
      '--num-prompts', '12', '--random-input-len', '16', '--random-output-len', '4',
      '--image-ratio', '0.5', '--image-size', '56x56', '--max-concurrency', '4', '--seed', '5'],
    { url: vl.url, model });
    assert.equal(code, 0, stderr);
    holdsTogether(r, 12);
    const encoded = await waitFor('the visual counters', async () => {
      const text = await fetch(`${vl.url}/metrics`).then((res) => res.text());
      const n = Number(text.match(/vlmd_visual_images_encoded\{[^}]*\} (\d+)/)?.[1]);
      return n === r.num_images ? n : false;
    }, 5000);
    assert.ok(r.num_images >= 2 && r.num_images <= 10, `12 prompts, half with an image: ${r.num_images}`);
    assert.equal(encoded, r.num_images, 'every image was new, so every one was encoded');
  } finally {
    assert.deepEqual(await stopServer(vl), { code: 0, signal: null }, vl.stderr.slice(-3000));
  }
});
