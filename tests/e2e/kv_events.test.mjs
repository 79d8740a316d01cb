// kv_events.test.mjs - --kv-events-endpoint as llm-d's precise prefix scorer
// sees it: a ZeroMQ subscriber gets vLLM's event batches [topic, sequence,
// msgpack EventBatch], BlockStored carries a prompt's blocks with the hash
// chain computed here independently (FNV-64a over canonical CBOR, llm-d's
// token processor), BlockRemoved comes when a small KV cache evicts them, and
// replaying every event rebuilds as many blocks as the engine says it holds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as zmq from 'zeromq';
import { decode } from '@msgpack/msgpack';
import { FIXTURES, startServer, stopServer, postJson, waitFor } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const B = 16;

// ---- the hash, from llm-d's definition -------------------------------------------
const MASK = (1n << 64n) - 1n;
function fnv64a(bytes, h = 0xcbf29ce484222325n) {
  for (const b of bytes) h = ((h ^ BigInt(b)) * 0x100000001b3n) & MASK;
  return h;
}
// canonical CBOR heads: major type, shortest argument
function head(major, v) {
  v = BigInt(v);
  const m = major << 5;
  if (v < 24n) return [m | Number(v)];
  const sizes = [[0xffn, 24, 1], [0xffffn, 25, 2], [0xffffffffn, 26, 4], [MASK, 27, 8]];
  const [, ai, n] = sizes.find(([max]) => v <= max);
  const out = [m | ai];
  for (let i = n - 1; i >= 0; i--) out.push(Number((v >> BigInt(8 * i)) & 0xffn));
  return out;
}
const cborNull = [0xf6];
const cborText = (s) => [...head(3, Buffer.byteLength(s)), ...Buffer.from(s)];
const blockHash = (parent, tokens) =>
  fnv64a([...head(4, 3), ...head(0, parent), ...head(4, tokens.length), ...tokens.flatMap((t) => head(0, t)), ...cborNull]);
const rootHash = (seed, model) => fnv64a([...head(4, 3), ...head(0, fnv64a(Buffer.from(seed))), ...cborNull, ...cborText(model)]);

function chain(tokens, root) {
  const out = [];
  let parent = root;
  for (let i = 0; i + B <= tokens.length; i += B) out.push(parent = blockHash(parent, tokens.slice(i, i + B)));
  return out;
}

// ---- the subscriber -----------------------------------------------------------------
async function subscribe(endpoint) {
  const sock = new zmq.Subscriber({ reconnectInterval: 10 });
  const sub = { sock, batches: [], handshake: false, closed: false };
  sock.events.on('handshake', () => { sub.handshake = true; });
  sock.connect(endpoint);
  sock.subscribe();
  (async () => {
    try {
      for await (const frames of sock) {
        assert.equal(frames.length, 3, 'topic, sequence, payload');
        const [topic, seq, payload] = frames;
        assert.equal(seq.length, 8);
        sub.batches.push({ topic: topic.toString(), seq: seq.readBigUInt64BE(0), batch: decode(payload, { useBigInt64: true }) });
      }
    } catch (e) {
      if (!sub.closed) throw e;
    }
  })();
  return sub;
}

const big = (x) => (x === null ? null : BigInt(x));

test('BlockStored with the hash chain, BlockRemoved on eviction, the replay holds what the engine holds', async () => {
  const dir = mkdtempSync(`${tmpdir()}/vlmd-kv-`);
  const endpoint = `ipc://${dir}/kv.sock`;
  const sub = await subscribe(endpoint);
  // a cache of 512 tokens holds about three of these prompts
  const server = await startServer(['--model', MODEL, '--port', '0', '--kv-events-endpoint', endpoint,
    '--kv-events-topic', 'kv@test@qwen2', '--max-total-token-num', '512', '--max-model-len', '512',
    '--batch-max-tokens', '256', '--heartbeat-ms', '50'], { readyTimeoutMs: 120000 });
  try {
    await waitFor('the subscriber to connect', () => sub.handshake, 20000);
    const prompts = Array.from({ length: 6 }, (_, p) => Array.from({ length: 150 }, (_, i) => 10 + ((p * 131 + i * 7) % 900)));
    const root = rootHash('', 'qwen2');
    const expected = prompts.map((t) => chain(t, root));
    for (const prompt of prompts) {
      const r = await postJson(`${server.url}/v1/completions`, { prompt, max_tokens: 1, temperature: 0 }, { timeoutMs: 60000 });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    // replay: every batch in order, no gap in the sequence numbers
    const held = new Set();
    const stored = new Set(), removed = new Set();
    let next = null, cursor = 0, failure = null;
    // the first wrong batch fails the test (not retried by waitFor)
    const replay = () => {
      try {
        replayNew();
      } catch (e) {
        failure ??= e;
      }
    };
    const replayNew = () => {
      while (cursor < sub.batches.length) {
        const { topic, seq, batch } = sub.batches[cursor++];
        assert.equal(topic, 'kv@test@qwen2');
        if (next !== null) assert.equal(seq, next, 'no batch lost');
        next = seq + 1n;
        const [ts, events, rank] = batch;
        assert.equal(typeof ts, 'number');
        assert.equal(rank, 0, 'data_parallel_rank');
        for (const ev of events) {
          if (ev[0] === 'BlockStored') {
            const [, hashes, parent, tokens, blockSize, loraId, medium] = ev;
            assert.equal(blockSize, B);
            assert.equal(loraId, null);
            assert.equal(medium, 'GPU');
            assert.equal(tokens.length, hashes.length * B);
            // each block chains on the one before it
            let p = parent === null ? root : big(parent);
            hashes.forEach((h, i) => {
              assert.equal(big(h), p = blockHash(p, tokens.slice(i * B, (i + 1) * B)), 'the chain');
              held.add(big(h));
              stored.add(big(h));
            });
          } else if (ev[0] === 'BlockRemoved') {
            for (const h of ev[1]) {
              assert.ok(held.delete(big(h)), 'only what was stored is removed');
              removed.add(big(h));
            }
            assert.equal(ev[2], 'GPU');
          } else {
            assert.deepEqual(ev, ['AllBlocksCleared']);
            held.clear();
          }
        }
      }
    };
    // the engine's count of the blocks it holds arrives with its heartbeat, which can be a
    // beat behind the batches: wait for the last prompt's blocks too, then for the counts
    await waitFor('the replay to hold what the engine holds', async () => {
      replay();
      if (failure) return 'failed';
      if (!expected[5].every((h) => stored.has(h))) return false;
      const text = await fetch(`${server.url}/metrics`).then((r) => r.text());
      const blocks = Number(text.match(/^vlmd_llm_kv_event_blocks\{rank="0"\} (\d+)$/m)?.[1]);
      const sent = Number(text.match(/^vlmd_llm_kv_event_batches_total\{rank="0"\} (\d+)$/m)?.[1]);
      return blocks === held.size && next !== null && sent === Number(next);
    }, 20000);
    if (failure) throw failure;
    for (const [p, hashes] of expected.entries())
      for (const h of hashes) assert.ok(stored.has(h), `prompt ${p}: its blocks were stored with the expected hashes`);
    for (const h of expected[0]) assert.ok(removed.has(h), 'the first prompt was evicted');
    for (const h of expected[5]) assert.ok(held.has(h), 'the last prompt is held');
  } finally {
    sub.closed = true;
    sub.sock.close();
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
