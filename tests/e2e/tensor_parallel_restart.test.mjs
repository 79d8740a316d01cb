// tensor_parallel_restart.test.mjs - a tensor-parallel group is restarted whole: a rank killed
// or frozen under load takes the group down (never a half-group serving), every request in
// flight gets its answer or a clear 503, and the group comes back with new processes for every
// rank and the same answers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FIXTURES, startServer, stopServer, postJson, getJson, waitFor, pidAlive, sleep } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const FAST = ['--heartbeat-ms', '100', '--heartbeat-timeout-ms', '1000', '--restart-backoff-ms', '100'];
const ranksOf = (health) => health.processes.filter((p) => p.role === 'llm');

async function groupLosesARank(signal) {
  const server = await startServer(['--model', MODEL, '--port', '0', '--device', 'cpu',
    '--tensor-parallel-size', '2', ...FAST]);
  try {
    const probe = { prompt: 'Tell me a story about a cat.', max_tokens: 16, temperature: 0 };
    const before = await postJson(`${server.url}/v1/completions`, probe);
    assert.equal(before.status, 200);
    const old = ranksOf((await getJson(`${server.url}/health`)).body);
    assert.deepEqual(old.map((p) => p.state), ['ready', 'ready']);

    // long requests in flight when rank 1 goes
    const inFlight = Array.from({ length: 6 }, (_, i) => postJson(`${server.url}/v1/completions`,
      { prompt: `request ${i}`, max_tokens: 3000, ignore_eos: true, temperature: 0 }, { timeoutMs: 60000 }));
    await sleep(300);
    process.kill(old[1].pid, signal);
    const answers = await Promise.all(inFlight);
    for (const [i, r] of answers.entries()) {
      if (r.status === 200) continue; // finished before the group went down
      assert.equal(r.status, 503, `request ${i}: ${JSON.stringify(r.body)}`);
      assert.match(r.body.error.message, /engine/i, `request ${i} says why`);
    }
    assert.ok(answers.some((r) => r.status === 503), 'the requests in flight were failed, not left hanging');

    // the whole group is new: rank 0 restarted too
    const back = await waitFor('a new group ready', async () => {
      const h = (await getJson(`${server.url}/health`)).body;
      const r = ranksOf(h);
      return h.status === 'ok' && r.every((p, k) => p.state === 'ready' && p.pid !== old[k].pid) && r;
    }, 20000);
    for (const p of old) assert.ok(!pidAlive(p.pid), `old rank ${p.rank} (pid ${p.pid}) is gone`);
    assert.ok(back.every((p) => p.restarts >= 1), 'every rank counted a restart');
    assert.match(server.stderr, /its group lost rank 1; killing it to restart the group/);

    const after = await postJson(`${server.url}/v1/completions`, probe);
    assert.equal(after.status, 200);
    assert.equal(after.body.choices[0].text, before.body.choices[0].text, 'the same answer from the new group');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
}

test('a rank killed under load: the group restarts whole and serves the same answers', () =>
  groupLosesARank('SIGKILL'));

test('a rank frozen under load: missed heartbeats end it, and the group restarts whole', () =>
  groupLosesARank('SIGSTOP'));
