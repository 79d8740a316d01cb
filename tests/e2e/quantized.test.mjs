// quantized.test.mjs - quantized checkpoints served as published (the CPU): an FP8
// (128x128 blocks) and an AWQ fixture model give each case's greedy continuation through
// /v1/completions, /memory_stats and the start-up log say the weights' format, and a
// checkpoint in a format vlmd does not serve is refused at start (exit 2) naming it and
// what is served.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FIXTURES, SCALE, startServer, stopServer, postJson, getJson, runToExit, makeDecoder }
  from './harness.mjs';

const served = [
  { name: 'qwen3_fp8_block', format: /^fp8 e4m3, 128x128 block scales, the rest BF16$/ },
  { name: 'qwen3_awq', format: /^awq int4, groups of 128, the rest F16$/ },
  // its kv_cache_scheme: an FP8 KV cache at the checkpoint's scales (--kv-cache-dtype auto)
  { name: 'qwen3_fp8_kv', format: /^fp8 e4m3, channel scales, the rest BF16$/, kv: 'F8_E4M3' },
];

for (const { name, format, kv } of served) {
  test(`${name}: greedy continuations as the reference, the format said`, async () => {
    const dir = `${FIXTURES}/quant/${name}`;
    const ref = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
    const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
    const server = await startServer(['--model', dir, '--port', '0', '--device', 'cpu']);
    try {
      for (const [i, c] of ref.cases.entries()) {
        const t = await postJson(`${server.url}/tokenize`, { messages: c.messages,
          chat_template_kwargs: { enable_thinking: false } }); // Qwen3-8B's rendering here
        assert.equal(t.status, 200, JSON.stringify(t.body));
        assert.deepEqual(t.body.tokens, c.input_ids, `case ${i}: the prompt's ids`);
        const r = await postJson(`${server.url}/v1/completions`, { prompt: c.input_ids,
          max_tokens: c.greedy_continuation.length, temperature: 0, ignore_eos: true },
        { timeoutMs: 60000 * SCALE });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(r.body.choices[0].text, decode(c.greedy_continuation), `case ${i}`);
      }
      const stats = await getJson(`${server.url}/memory_stats`);
      assert.match(stats.body.llm.memory.weights_format, format);
      if (kv) {
        assert.equal(stats.body.llm.memory.kv_dtype, kv);
        const health = await getJson(`${server.url}/health`);
        assert.match(JSON.stringify(health.body), /fp8 e4m3, per-layer scales K [^"]* from the checkpoint/);
      }
      assert.ok(stats.body.llm.memory.weights_bytes > 0);
      assert.match(server.stderr, /MiB of weights \((fp8|awq)/);
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });
}

test('a format vlmd does not serve is refused at start, naming it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-quant-'));
  try {
    const src = `${FIXTURES}/quant/qwen3_awq`;
    for (const f of readdirSync(src)) copyFileSync(`${src}/${f}`, `${dir}/${f}`);
    const config = JSON.parse(readFileSync(`${src}/config.json`, 'utf8'));
    config.quantization_config = { quant_method: 'bitsandbytes', load_in_4bit: true };
    writeFileSync(`${dir}/config.json`, JSON.stringify(config));
    const r = await runToExit(['serve', '--model', dir, '--port', '0', '--device', 'cpu'], 30000 * SCALE);
    assert.equal(r.code, 2, r.stderr.slice(-2000));
    assert.match(r.stderr, /quant_method 'bitsandbytes'; vlmd serves fp8/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--kv-cache-dtype fp8 without scales in the checkpoint measures them (or takes --kv-cache-scales); at TP 2 measuring is refused', async () => {
  const dir = `${FIXTURES}/qwen3`;
  const plain = await startServer(['--model', dir, '--port', '0', '--device', 'cpu']);
  let perToken;
  try {
    perToken = (await getJson(`${plain.url}/memory_stats`)).body.llm.memory.kv_bytes_per_token;
  } finally {
    assert.deepEqual(await stopServer(plain), { code: 0, signal: null }, plain.stderr.slice(-3000));
  }
  const server = await startServer(['--model', dir, '--port', '0', '--device', 'cpu',
    '--kv-cache-dtype', 'fp8']);
  try {
    const mem = (await getJson(`${server.url}/memory_stats`)).body.llm.memory;
    assert.equal(mem.kv_dtype, 'F8_E4M3');
    assert.equal(mem.kv_bytes_per_token * 4, perToken, 'a byte an element, not fp32\'s four');
    assert.match(server.stderr, /KV cache: fp8 e4m3 with per-layer scales .* measured at start-up/);
    const health = await getJson(`${server.url}/health`);
    assert.match(JSON.stringify(health.body), /measured at start-up/);
    const r = await postJson(`${server.url}/v1/completions`, { prompt: 'Hello', max_tokens: 4,
      temperature: 0 }, { timeoutMs: 60000 * SCALE });
    assert.equal(r.status, 200, JSON.stringify(r.body));
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
  const fixed = await startServer(['--model', dir, '--port', '0', '--device', 'cpu',
    '--kv-cache-dtype', 'fp8', '--kv-cache-scales', '0.05,0.02']);
  try {
    const health = await getJson(`${fixed.url}/health`);
    assert.match(JSON.stringify(health.body), /K 0.05..0.05, V 0.02..0.02, given by --kv-cache-scales/);
  } finally {
    assert.deepEqual(await stopServer(fixed), { code: 0, signal: null }, fixed.stderr.slice(-3000));
  }
  const bad = await runToExit(['serve', '--model', dir, '--port', '0', '--device', 'cpu',
    '--kv-cache-dtype', 'fp8', '--kv-cache-scales', '0.05'], 60000 * SCALE);
  assert.equal(bad.code, 1, bad.stderr.slice(-2000)); // the launcher's, on its engine's exit 2
  assert.match(bad.stderr, /--kv-cache-scales '0.05': two positive numbers K,V/);
  const tp = await runToExit(['serve', '--model', dir, '--port', '0', '--device', 'cpu',
    '--kv-cache-dtype', 'fp8', '--tensor-parallel-size', '2'], 60000 * SCALE);
  assert.equal(tp.code, 1, tp.stderr.slice(-2000)); // the launcher's, on its engine's exit 2
  assert.match(tp.stderr, /measuring KV scales over 2 ranks is not supported yet/);
});
