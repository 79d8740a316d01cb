// overload.test.mjs - one client's costly traffic cannot stop the server: prompts
// that cost seconds of CPU (megabytes of spaces, many JSON objects) are worked on
// off the frontend's loop, which keeps answering and sending its heartbeats, and a
// process that keeps being killed is restarted without end (docs/SECURITY.md).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { BIN, FIXTURES, SCALE, startServer, stopServer, postJson, getJson, waitFor, sleep } from './harness.mjs';

const byRole = (health, role) => health.processes.find((p) => p.role === role);

test('eight 4 MiB prompts of spaces at once: the frontend keeps answering and is never killed', async (t) => {
  // The demo model, as make demo serves it: its tokenizer merges runs of spaces, the
  // BPE that once took seconds a prompt on the frontend's loop.
  const model = mkdtempSync(`${tmpdir()}/vlmd-demo-`);
  execFileSync(`${BIN}/vlmd-make-demo-model`, [model]);
  const server = await startServer(['--model', model, '--port', '0'], { readyTimeoutMs: 120000 * SCALE });
  try {
    const url = `${server.url}/v1/chat/completions`;
    const before = byRole((await getJson(`${server.url}/health`)).body, 'frontend');
    const spaces = ' '.repeat(4 * 1024 * 1024 - 256);
    let done = false, worstHealthMs = 0, healthFailures = 0;
    const poll = (async () => {
      while (!done) {
        const t0 = Date.now();
        const h = await getJson(`${server.url}/health`, { timeoutMs: 30000 * SCALE }).catch(() => null);
        worstHealthMs = Math.max(worstHealthMs, Date.now() - t0);
        if (!h || h.status !== 200) healthFailures++;
        await sleep(100);
      }
    })();
    const heavy = Array.from({ length: 8 }, () =>
      postJson(url, { messages: [{ role: 'user', content: spaces }], max_tokens: 1 }, { timeoutMs: 120000 * SCALE }));
    await sleep(200);
    const t0 = Date.now();
    const small = await postJson(url, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
      { timeoutMs: 60000 * SCALE });
    const smallMs = Date.now() - t0;
    const answers = await Promise.all(heavy);
    done = true;
    await poll;
    t.diagnostic(`a small request beside them: ${smallMs} ms; the slowest /health: ${worstHealthMs} ms`);
    assert.equal(small.status, 200, 'a small request is served meanwhile');
    for (const a of answers) // too long for the context (a 400 naming it), never a dropped connection
      assert.ok(a.status === 200 || (a.status === 400 && /context|tokens/.test(a.body.error.message)),
        `${a.status}: ${JSON.stringify(a.body).slice(0, 200)}`);
    assert.equal(healthFailures, 0, '/health answered 200 throughout');
    const after = byRole((await getJson(`${server.url}/health`)).body, 'frontend');
    assert.equal(after.pid, before.pid, 'the frontend was never killed');
    assert.equal(after.restarts, 0);
    assert.ok(!/stopped answering|killing it/.test(server.stderr), server.stderr.slice(-2000));
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    rmSync(model, { recursive: true, force: true });
  }
});

test('a body of a million JSON objects is refused before it is parsed; the server goes on', async () => {
  const server = await startServer(['--model', `${FIXTURES}/qwen2`, '--port', '0']);
  try {
    const raw = `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "x": [${'{},'.repeat(1000000)}{}]}`;
    const r = await getJson(`${server.url}/v1/chat/completions`, { method: 'POST', raw, timeoutMs: 60000 * SCALE });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, 'invalid_json');
    assert.match(r.body.error.message, /65536 JSON objects and arrays/);
    const ok = await postJson(`${server.url}/v1/chat/completions`,
      { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
    assert.equal(ok.status, 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('a process killed again and again is restarted every time; the server never stops for it', async (t) => {
  // Past --max-restarts-per-minute, restarts slow to --restart-backoff-max-ms; they never end.
  const server = await startServer(['--model', `${FIXTURES}/qwen2`, '--port', '0', '--restart-backoff-ms', '20',
    '--restart-backoff-max-ms', '300', '--max-restarts-per-minute', '2']);
  try {
    let pid = byRole((await getJson(`${server.url}/health`)).body, 'frontend').pid;
    for (let kill = 1; kill <= 5; kill++) {
      process.kill(pid, 'SIGKILL');
      pid = await waitFor(`frontend back after kill ${kill}`, async () => {
        if (server.exited) throw new Error(`vlmd stopped after kill ${kill}:\n${server.stderr.slice(-2000)}`);
        const h = await getJson(`${server.url}/health`).catch(() => null);
        const f = h && h.status === 200 && byRole(h.body, 'frontend');
        return f && f.pid !== pid && f.state === 'ready' && f.pid;
      }, 30000 * SCALE);
    }
    const f = byRole((await getJson(`${server.url}/health`)).body, 'frontend');
    assert.equal(f.restarts, 5);
    assert.match(server.stderr, /restarting it every 300 ms/);
    const r = await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 1 });
    assert.equal(r.status, 200);
    t.diagnostic('five kills past the limit of two a minute: served throughout the restarts');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
