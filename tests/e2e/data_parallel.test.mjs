// data_parallel.test.mjs - two CPU engines behind one router (--data-parallel-size 2): a burst
// spreads over both; a request sharing a long prefix goes to the engine holding it even when the
// other is idle; each engine publishes its KV events on its own endpoint with its
// data_parallel_rank; a large request goes to the engine --route-large-requests names and the
// small ones stay off it while it is busy; killing one engine fails only its requests, the other
// keeps serving, and the lost engine comes back alone.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as zmq from 'zeromq';
import { decode } from '@msgpack/msgpack';
import { FIXTURES, SCALE, startServer, stopServer, postJson, getJson, waitFor, pidAlive, runToExit } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const FAST = ['--heartbeat-ms', '100', '--heartbeat-timeout-ms', '1000', '--restart-backoff-ms', '100'];
const engines = (health) => health.processes.filter((p) => p.role === 'llm');

// The router's count of the requests it sent to each engine.
async function admitted(url) {
  const text = await fetch(`${url}/metrics`).then((r) => r.text());
  return [0, 1].map((g) => Number(text.match(new RegExp(
    `^vlmd_router_engine_${g}_requests_admitted_total\\{rank="0"\\} (\\d+)$`, 'm'))?.[1]));
}

// Where the n requests sent since `before` went, per engine, once the router's snapshot (a
// heartbeat behind) counts them all.
async function wentSince(url, before, n) {
  return waitFor(`the router to count ${n} request(s)`, async () => {
    const now = (await admitted(url)).map((c, g) => c - before[g]);
    return now[0] + now[1] >= n && now;
  }, 10000 * SCALE, 20);
}

async function subscribe(endpoint) {
  const sock = new zmq.Subscriber({ reconnectInterval: 10 });
  const sub = { sock, ranks: [], handshake: false, closed: false };
  sock.events.on('handshake', () => { sub.handshake = true; });
  sock.connect(endpoint);
  sock.subscribe();
  (async () => {
    try {
      for await (const [, , payload] of sock) sub.ranks.push(decode(payload, { useBigInt64: true })[2]);
    } catch (e) {
      if (!sub.closed) throw e;
    }
  })();
  return sub;
}

const complete = (url, body, timeoutMs = 60000 * SCALE) =>
  postJson(`${url}/v1/completions`, { temperature: 0, ...body }, { timeoutMs });

test('two engines: a burst spreads, a shared prefix finds its engine, each publishes its events, one killed fails only its requests', async () => {
  const dir = mkdtempSync(`${tmpdir()}/vlmd-dp-`);
  const endpoint = `ipc://${dir}/kv.sock`;
  const subs = [await subscribe(endpoint), await subscribe(`${endpoint}_dp1`)];
  const server = await startServer(['--model', MODEL, '--port', '0', '--device', 'cpu',
    '--data-parallel-size', '2', '--kv-events-endpoint', endpoint, ...FAST], { readyTimeoutMs: 120000 * SCALE });
  try {
    const h = (await getJson(`${server.url}/health`)).body;
    const old = engines(h);
    assert.deepEqual(old.map((p) => [p.rank, p.state, p.config['data-parallel-rank']]),
      [[0, 'ready', '0'], [1, 'ready', '1']]);
    const mem = (await getJson(`${server.url}/memory_stats`)).body;
    assert.deepEqual([mem.llm.engine, mem['llm-1'].engine], [0, 1], '/memory_stats per engine');
    assert.ok(mem.llm.kv_capacity_tokens > 0 && mem['llm-1'].kv_capacity_tokens > 0);
    await waitFor('the subscribers to connect', () => subs.every((s) => s.handshake), 20000 * SCALE);

    // a burst of distinct prompts spreads over both
    let before = await admitted(server.url);
    const burst = await Promise.all(Array.from({ length: 8 }, (_, i) =>
      complete(server.url, { prompt: `burst request number ${i} about ${'cats '.repeat(i + 3)}`, max_tokens: 64, ignore_eos: true })));
    for (const r of burst) assert.equal(r.status, 200, JSON.stringify(r.body));
    const spread = await wentSince(server.url, before, 8);
    assert.equal(spread[0] + spread[1], 8);
    assert.ok(spread[0] >= 2 && spread[1] >= 2, `both engines served the burst: ${spread}`);
    // the frontend's observations go to the engine that answered
    const text = await fetch(`${server.url}/metrics`).then((r) => r.text());
    for (const g of [0, 1]) {
      const n = text.match(new RegExp(`^vllm:e2e_request_latency_seconds_count\\{model_name="qwen2",engine="${g}"\\} (\\d+)$`, 'm'))?.[1];
      assert.equal(Number(n), spread[g], `engine ${g}'s requests in its latency histogram`);
    }

    // a long prompt, both engines idle: engine 0
    const prompt = Array.from({ length: 320 }, (_, i) => 10 + ((i * 37) % 900));
    before = await admitted(server.url);
    const first = await complete(server.url, { prompt, max_tokens: 1 });
    assert.equal(first.status, 200);
    assert.deepEqual(await wentSince(server.url, before, 1), [1, 0]);
    // engine 0 busy with another request, engine 1 idle: the prompt's continuation still goes
    // where its prefix is cached
    const filler = complete(server.url, { prompt: 'a filler that keeps engine 0 busy', max_tokens: 2000, ignore_eos: true });
    assert.deepEqual(await wentSince(server.url, before, 2), [2, 0], 'the filler at engine 0');
    const again = await complete(server.url, { prompt: [...prompt, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], max_tokens: 1 });
    assert.equal(again.status, 200);
    assert.deepEqual(await wentSince(server.url, before, 3), [3, 0], 'the continuation went to engine 0');
    assert.ok(again.body.usage.prompt_tokens_details.cached_tokens >= 320 - 16,
      `its prefix came from the cache: ${JSON.stringify(again.body.usage)}`);
    assert.equal((await filler).status, 200);

    // each engine's events on its own endpoint, with its data_parallel_rank
    await waitFor('both engines to publish', () => subs.every((s) => s.ranks.length > 0), 10000 * SCALE);
    assert.ok(subs[0].ranks.every((r) => r === 0), `engine 0's batches: ${subs[0].ranks}`);
    assert.ok(subs[1].ranks.every((r) => r === 1), `engine 1's batches: ${subs[1].ranks}`);

    // engine 1 killed under load: only its requests fail
    before = await admitted(server.url);
    const inFlight = Array.from({ length: 6 }, (_, i) =>
      complete(server.url, { prompt: `long request ${i} ${'dogs '.repeat(i + 1)}`, max_tokens: 2000, ignore_eos: true }));
    const split = await wentSince(server.url, before, 6);
    assert.ok(split[1] >= 1, `engine 1 has requests: ${split}`);
    process.kill(old[1].pid, 'SIGKILL');
    const answers = await Promise.all(inFlight);
    const ok = answers.filter((r) => r.status === 200).length;
    const failed = answers.filter((r) => r.status === 503);
    assert.equal(ok + failed.length, 6, JSON.stringify(answers.map((r) => r.status)));
    assert.ok(failed.length >= 1 && failed.length <= split[1], `only engine 1's failed: ${failed.length} of its ${split[1]}`);
    assert.ok(ok >= split[0], `engine 0's all finished: ${ok} of ${split[0]}`);
    for (const r of failed) assert.match(r.body.error.message, /engine/i);

    // engine 0 serves meanwhile; engine 1 comes back alone
    const during = await complete(server.url, { prompt: 'still there?', max_tokens: 4 });
    assert.equal(during.status, 200);
    await waitFor('engine 1 back', async () => {
      const e = engines((await getJson(`${server.url}/health`)).body);
      return e[1].state === 'ready' && e[1].pid !== old[1].pid;
    }, 30000 * SCALE);
    const now = engines((await getJson(`${server.url}/health`)).body);
    assert.equal(now[0].pid, old[0].pid, 'engine 0 was not restarted');
    assert.ok(!pidAlive(old[1].pid));
  } finally {
    for (const s of subs) {
      s.closed = true;
      s.sock.close();
    }
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('--route-large-requests: a large request goes to the named engine, the small ones stay off it while it is busy', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--device', 'cpu',
    '--data-parallel-size', '2', '--route-large-requests', '200=1', ...FAST], { readyTimeoutMs: 120000 * SCALE });
  try {
    const before = await admitted(server.url);
    const large = complete(server.url, { prompt: Array.from({ length: 150 }, (_, i) => 20 + i), max_tokens: 2000, ignore_eos: true });
    assert.deepEqual(await wentSince(server.url, before, 1), [0, 1], 'the large request at engine 1');
    const small = await Promise.all(Array.from({ length: 4 }, (_, i) =>
      complete(server.url, { prompt: `small ${i}`, max_tokens: 16 })));
    for (const r of small) assert.equal(r.status, 200);
    assert.equal((await large).status, 200);
    assert.deepEqual(await wentSince(server.url, before, 5), [4, 1], 'the small ones all went to engine 0');
    // both idle: a large one still goes to engine 1, a small one to either
    const next = await admitted(server.url);
    assert.equal((await complete(server.url, { prompt: Array.from({ length: 150 }, (_, i) => 30 + i), max_tokens: 60 })).status, 200);
    assert.deepEqual(await wentSince(server.url, next, 1), [0, 1]);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('vlmd serve gives each engine its number, and refuses a route to an engine it does not run', async () => {
  const given = await runToExit(['serve', '--model', MODEL, '--data-parallel-size', '2', '--data-parallel-rank', '1']);
  assert.equal(given.code, 2);
  assert.match(given.stderr, /--data-parallel-rank 1: vlmd serve gives each engine process its own engine/);
  const route = await runToExit(['serve', '--model', MODEL, '--data-parallel-size', '2', '--route-large-requests', '4096=2']);
  assert.equal(route.code, 2);
  assert.match(route.stderr, /--route-large-requests: '4096=2' is not TOKENS=ENGINE/);
});
