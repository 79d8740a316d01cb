// hardening.test.mjs - the server under bad clients and faults: API keys,
// every request limit at and one past its value, timeouts that cut off slow
// and stuck clients while others are served, workers killed during a load,
// and a SIGTERM that lets running requests finish.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, chmodSync, existsSync, readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import http2 from 'node:http2';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import OpenAI from 'openai';
import { FIXTURES, SCALE, startServer, stopServer, postJson, getJson, waitFor, sleep, pidAlive } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const chat = (content, extra = {}) => ({ messages: [{ role: 'user', content }], max_tokens: 2, ...extra });

// Sends text on a raw connection; resolves with what came back and how long until the server closed it.
function raw(url, write, { waitMs = 5000 } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const t0 = Date.now();
    let data = '';
    const sock = net.connect(Number(port), hostname, () => write(sock));
    sock.setEncoding('utf8');
    sock.on('data', (d) => { data += d; });
    const done = (closed) => { clearTimeout(timer); sock.destroy(); resolve({ data, closed, ms: Date.now() - t0 }); };
    sock.on('close', () => done(true));
    sock.on('error', () => done(true));
    const timer = setTimeout(() => done(false), waitMs);
  });
}

test('API keys: missing, wrong and right; from a file and the environment; never shown', async () => {
  const dir = mkdtempSync(`${tmpdir()}/vlmd-keys-`);
  writeFileSync(`${dir}/keys`, '# test keys\nsk-file-key-123\n');
  chmodSync(`${dir}/keys`, 0o600);
  const server = await startServer(['--model', MODEL, '--port', '0', '--api-key-file', `${dir}/keys`,
    '--metrics-need-key', 'yes'], { env: { VLMD_API_KEY: 'sk-env-key-456' } });
  try {
    const url = `${server.url}/v1/chat/completions`;
    const none = await postJson(url, chat('hi'));
    assert.equal(none.status, 401);
    assert.equal(none.body.error.type, 'authentication_error');
    assert.equal(none.body.error.code, 'invalid_api_key');
    const wrong = await postJson(url, chat('hi'), { headers: { authorization: 'Bearer sk-file-key-12' } });
    assert.equal(wrong.status, 401, 'a prefix of a key is not a key');
    for (const key of ['sk-file-key-123', 'sk-env-key-456']) {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: key, maxRetries: 0 });
      const r = await client.chat.completions.create(chat('hi'));
      assert.equal(r.choices.length, 1, `${key} works`);
    }
    assert.equal((await getJson(`${server.url}/v1/models`)).status, 401);
    assert.equal((await getJson(`${server.url}/health`)).status, 200, '/health stays open');
    assert.equal((await getJson(`${server.url}/memory_stats`)).status, 401, '--metrics-need-key yes');
    assert.equal((await getJson(`${server.url}/memory_stats`, { headers: { authorization: 'Bearer sk-env-key-456' } })).status, 200);
    const healthBody = (await getJson(`${server.url}/health`)).body;
    // only the frontend inherits VLMD_API_KEY: the others have no use for it
    for (const p of healthBody.processes) {
      const env = readFileSync(`/proc/${p.pid}/environ`, 'latin1');
      assert.equal(env.includes('VLMD_API_KEY='), p.role === 'frontend', `${p.role}'s environment`);
    }
    const health = JSON.stringify(healthBody);
    for (const key of ['sk-file-key-123', 'sk-env-key-456']) {
      assert.ok(!health.includes(key), '/health never shows a key');
      assert.ok(!server.stderr.includes(key) && !server.stdout.includes(key), 'the logs never show a key');
    }
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('every request limit: at the limit passes, one past gets its status', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-body-bytes', '4096',
    '--max-header-bytes', '2048', '--max-messages', '3', '--max-prompt-bytes', '100',
    '--max-output-tokens', '8', '--max-connections', '8']);
  try {
    const url = `${server.url}/v1/chat/completions`;
    const sized = (n) => { const s = JSON.stringify(chat('x')); return s.slice(0, -1) + ' '.repeat(n - s.length) + '}'; };
    assert.equal((await postJson(url, undefined, { raw: sized(4096) })).status, 200, 'a body of exactly --max-body-bytes');
    const over = await postJson(url, undefined, { raw: sized(4097) });
    assert.equal(over.status, 413);
    assert.equal(over.body.error.code, 'request_too_large');

    assert.equal((await postJson(url, chat('x'), { headers: { 'x-pad': 'p'.repeat(1800) } })).status, 200);
    const big = await postJson(url, chat('x'), { headers: { 'x-pad': 'p'.repeat(2100) } });
    assert.equal(big.status, 431);

    const msgs = (n) => ({ messages: Array.from({ length: n }, () => ({ role: 'user', content: 'x' })), max_tokens: 2 });
    assert.equal((await postJson(url, msgs(3))).status, 200);
    const four = await postJson(url, msgs(4));
    assert.equal(four.status, 400);
    assert.equal(four.body.error.param, 'messages');
    assert.equal(four.body.error.code, 'too_many_messages');

    assert.equal((await postJson(url, chat('a'.repeat(100)))).status, 200);
    const text = await postJson(url, chat('a'.repeat(101)));
    assert.equal(text.status, 400);
    assert.equal(text.body.error.code, 'prompt_too_large');

    assert.equal((await postJson(url, chat('x', { max_tokens: 8 }))).status, 200);
    const tokens = await postJson(url, chat('x', { max_tokens: 9 }));
    assert.equal(tokens.status, 400);
    assert.equal(tokens.body.error.param, 'max_tokens');

    // eight idle connections fill --max-connections: a ninth is closed at once
    const { port } = new URL(server.url);
    const idle = await Promise.all(Array.from({ length: 8 }, () => new Promise((r) => {
      const s = net.connect(Number(port), '127.0.0.1', () => r(s));
    })));
    await sleep(100);
    await assert.rejects(postJson(url, chat('x')), 'the ninth connection is closed');
    idle.forEach((s) => s.destroy());
    await waitFor('a connection again', async () => (await postJson(url, chat('x'))).status === 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('timeouts cut off slow, stuck and silent clients while others are served', async () => {
  // the engine is paused below: a long heartbeat timeout keeps the router from declaring it down
  const server = await startServer(['--model', MODEL, '--port', '0', '--keepalive-timeout-s', '1',
    '--request-timeout-s', '1', '--send-timeout-s', '1', '--heartbeat-timeout-ms', '60000']);
  try {
    const trickle = raw(server.url, (s) => {
      const text = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(100);
      let i = 0;
      const t = setInterval(() => { if (i < text.length && !s.destroyed) s.write(text[i++]); else clearInterval(t); }, 50);
    });
    const unfinished = raw(server.url, (s) => s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n'
      + 'Content-Length: 1000\r\n\r\n{"messa'));
    const idle = raw(server.url, () => {});
    const normal = await postJson(`${server.url}/v1/chat/completions`, chat('hello'));
    assert.equal(normal.status, 200, 'a normal client is served meanwhile');
    for (const [what, p] of [['headers trickled', trickle], ['a body never finished', unfinished], ['an idle connection', idle]]) {
      const r = await p;
      assert.ok(r.closed && r.ms < 3000, `${what}: closed after ${r.ms} ms`);
    }

    // a request the engine does not answer within --request-timeout-s: 504
    const llm = (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'llm');
    process.kill(llm.pid, 'SIGSTOP');
    let timedOut;
    try {
      timedOut = await postJson(`${server.url}/v1/chat/completions`, chat('hello'), { timeoutMs: 5000 });
    } finally {
      process.kill(llm.pid, 'SIGCONT');
    }
    assert.equal(timedOut.status, 504, JSON.stringify(timedOut.body));
    assert.match(timedOut.body.error.message, /--request-timeout-s/);

    // a stream nobody reads (HTTP/2: no window updates, so the server's sends
    // stall at once, whatever the kernel's buffers): its connection is cut and
    // its request cancelled
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'go on' }], max_tokens: 4000, stream: true,
      logprobs: true, top_logprobs: 20, temperature: 1, seed: 5 });
    const session = http2.connect(server.url);
    session.on('error', () => {});
    const stream = session.request({ ':method': 'POST', ':path': '/v1/chat/completions', 'content-type': 'application/json' });
    stream.on('error', () => {});
    stream.on('response', () => stream.pause()); // never read
    stream.end(body);
    const cut = await new Promise((r) => {
      const t = setTimeout(() => r(false), 15000);
      session.on('close', () => { clearTimeout(t); r(true); });
    });
    assert.ok(cut, 'the stuck stream was cut off');
    await waitFor('the cancelled request to leave the engine', async () => {
      const m = await fetch(`${server.url}/metrics`).then((r) => r.text());
      return /vlmd_llm_running\{rank="0"\} 0/.test(m) && /finished_reason="cancelled"\} [1-9]/.test(m);
    }, 10000);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

// The load a server's /metrics reports: requests in the engine's batches, waiting (the
// router's queue included), and requests the frontend counted as cancelled.
async function load(url) {
  const m = await fetch(`${url}/metrics`).then((r) => r.text());
  const value = (re) => Number(m.match(re)?.[1] ?? NaN);
  return { running: value(/^vllm:num_requests_running\{[^}]*\} (\S+)$/m),
    waiting: value(/^vllm:num_requests_waiting\{[^}]*\} (\S+)$/m),
    cancelled: value(/^vlmd_requests_finished_total\{[^}]*finished_reason="cancelled"\} (\d+)$/m),
    admitted: value(/^vlmd_router_requests_admitted_total\{[^}]*\} (\d+)$/m) };
}

// A non-streamed request's answer comes only at its end, so h2o writes nothing to an HTTP/1.1
// client before then and does not read its connection: a client that leaves must still be
// noticed, and every choice of its request cancelled, those queued at the router included,
// without the queued ones taking the room the running ones leave (issue 36: an abandoned
// n = 128 request ran to its end and a 1-token request waited 522 s).
test('a client that leaves a non-streamed n = 128 request: every choice is cancelled within 2 s (HTTP/1.1, HTTP/2)', async () => {
  // a small KV cache: one choice runs, the other 127 wait in the router's queue
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-total-token-num', '4096',
    '--heartbeat-ms', '50']);
  const body = JSON.stringify({ messages: [{ role: 'user', content: 'go on' }], n: 128, max_tokens: 3000,
    ignore_eos: true, temperature: 1, seed: 7 });
  const overH1 = () => {
    const { port } = new URL(server.url);
    const sock = net.connect(Number(port), '127.0.0.1');
    sock.on('error', () => {});
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    return () => sock.destroy();
  };
  const overH2 = () => {
    const session = http2.connect(server.url);
    session.on('error', () => {});
    const stream = session.request({ ':method': 'POST', ':path': '/v1/chat/completions', 'content-type': 'application/json' });
    stream.on('error', () => {});
    stream.end(body);
    return () => session.destroy();
  };
  try {
    for (const [name, send] of [['HTTP/1.1', overH1], ['HTTP/2', overH2]]) {
      const before = await load(server.url);
      const leave = send();
      await waitFor(`${name}: choices running and queued`, async () => {
        const l = await load(server.url);
        return l.running > 0 && l.waiting > 0;
      }, 20000);
      const admitted = (await load(server.url)).admitted;
      leave();
      const t0 = Date.now();
      const after = await waitFor(`${name}: every choice gone from the engine and the queue`, async () => {
        const l = await load(server.url);
        return l.running === 0 && l.waiting === 0 && l;
      }, 10000 * SCALE);
      const ms = Date.now() - t0;
      assert.ok(ms < 2000 * SCALE, `${name}: the choices left after ${ms} ms`);
      assert.equal(after.cancelled, before.cancelled + 1, `${name}: counted as one cancelled request`);
      assert.equal(after.admitted, admitted, `${name}: no queued choice went to the engine once the client left`);
      const t1 = Date.now();
      const next = await postJson(`${server.url}/v1/chat/completions`, chat('hi', { max_tokens: 1 }));
      assert.equal(next.status, 200, JSON.stringify(next.body));
      assert.ok(Date.now() - t1 < 5000 * SCALE, `${name}: the next request took ${Date.now() - t1} ms`);
    }
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('workers killed during a 32-request load: each request completes or gets a 503, and service comes back', async () => {
  const server = await startServer(['--model', `${FIXTURES}/qwen2_vl`, '--port', '0', '--restart-backoff-ms', '50',
    '--heartbeat-ms', '100', '--heartbeat-timeout-ms', '1000']);
  const runtimeDir = (await getJson(`${server.url}/health`)).body.processes
    .find((p) => p.role === 'router').listen_url.replace('ipc://', '').replace(/\/router\.sock$/, '');
  try {
    for (const role of ['visual', 'llm', 'router', 'frontend']) {
      const before = (await getJson(`${server.url}/health`)).body.processes;
      const pid = before.find((p) => p.role === role).pid;
      const load = Array.from({ length: 32 }, (_, i) => postJson(`${server.url}/v1/completions`,
        { prompt: `load ${i}`, max_tokens: 24, temperature: 0 }, { timeoutMs: 20000 })
        .then((r) => r.status, (e) => (role === 'frontend' ? 'connection lost' : Promise.reject(e))));
      await sleep(30);
      process.kill(pid, 'SIGKILL');
      const statuses = await Promise.all(load);
      for (const s of statuses)
        assert.ok(s === 200 || s === 503 || s === 'connection lost', `after killing ${role}: ${s}`);
      const t0 = Date.now();
      // back means the killed one was replaced (so reaped) and the new one is ready, not
      // only that text is served (it is while the visual worker is down)
      await waitFor(`service after killing ${role}`, async () => {
        const h = await getJson(`${server.url}/health`);
        const now = h.body.processes.find((p) => p.role === role);
        if (h.status !== 200 || now.pid === pid || now.state !== 'ready') return false;
        return (await postJson(`${server.url}/v1/completions`, { prompt: 'again', max_tokens: 2 })).status === 200;
      }, 10000);
      assert.ok(Date.now() - t0 < 10000, `${role}: serving again within 10 s`);
      const after = (await getJson(`${server.url}/health`)).body.processes;
      for (const other of ['llm', 'visual'].filter((r) => r !== role && role !== 'router'))
        assert.equal(after.find((p) => p.role === other).pid, before.find((p) => p.role === other).pid,
          `killing ${role} left ${other} running`);
      const zombies = execFileSync('ps', ['-o', 'stat=', '--ppid', String(server.child.pid)]).toString()
        .split('\n').filter((s) => s.startsWith('Z'));
      assert.equal(zombies.length, 0, `no zombie after killing ${role}`);
    }
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
  assert.ok(!existsSync(runtimeDir), `the runtime directory (sockets, embedding arena) is gone: ${runtimeDir}`);
});

test('a worker that hangs (missed heartbeats) is killed and restarted', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--restart-backoff-ms', '50',
    '--heartbeat-ms', '100', '--heartbeat-timeout-ms', '500']);
  try {
    const llm = (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'llm');
    process.kill(llm.pid, 'SIGSTOP');
    const hung = await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 4 }, { timeoutMs: 10000 });
    assert.equal(hung.status, 503, 'a hung engine answers nothing: the request fails, not waits');
    assert.match(hung.body.error.message, /engine/);
    await waitFor('a new engine', async () => {
      const h = await getJson(`${server.url}/health`);
      return h.status === 200 && h.body.processes.find((p) => p.role === 'llm').pid !== llm.pid;
    }, 15000);
    assert.ok(!pidAlive(llm.pid), 'the hung one was killed');
    assert.equal((await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 4 })).status, 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('SIGTERM drains: running requests finish, new ones are refused, then everything stops', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--drain-timeout-s', '20']);
  const pids = (await getJson(`${server.url}/health`)).body.processes.map((p) => p.pid);
  const running = postJson(`${server.url}/v1/completions`, { prompt: 'drain', max_tokens: 400, temperature: 0 },
    { timeoutMs: 30000 });
  await sleep(100);
  server.child.kill('SIGTERM');
  const r = await running;
  assert.equal(r.status, 200, 'the running request finished');
  assert.equal(r.body.usage.completion_tokens, 400);
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  for (const pid of pids) assert.ok(!pidAlive(pid), `process ${pid} is gone`);
});

// Streams a POST; resolves on its end with the status, the text and when it began.
function streamPost(url, body, { timeoutMs = 20000 } = {}) {
  let firstData;
  const started = new Promise((r) => { firstData = r; });
  const done = new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', agent: false, timeout: timeoutMs,
      headers: { 'content-type': 'application/json', connection: 'close' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; firstData(); });
      res.on('end', () => resolve({ status: res.statusCode, text }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`${url} timed out`)));
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
  return { started, done };
}

test('a frozen router is replaced: what it held ends at once, new requests get 503 until a new one serves', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--restart-backoff-ms', '50',
    '--heartbeat-ms', '100', '--heartbeat-timeout-ms', '1000', '--request-timeout-s', '120']);
  let frozen;
  try {
    const before = (await getJson(`${server.url}/health`)).body.processes;
    const pidOf = (procs, role) => procs.find((p) => p.role === role).pid;
    // a stream that has begun, held mid-way (its engine paused) while the router freezes
    const stream = streamPost(`${server.url}/v1/completions`, { prompt: 'tell me', max_tokens: 3000,
      ignore_eos: true, stream: true });
    await stream.started;
    process.kill(pidOf(before, 'llm'), 'SIGSTOP');
    frozen = pidOf(before, 'router');
    process.kill(frozen, 'SIGSTOP');
    process.kill(pidOf(before, 'llm'), 'SIGCONT');
    const t0 = Date.now();
    const fresh = await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 2 }, { timeoutMs: 10000 });
    assert.equal(fresh.status, 503, JSON.stringify(fresh.body));
    assert.ok(Date.now() - t0 < 8000, `answered in ${Date.now() - t0} ms, not at --request-timeout-s`);
    const ended = await stream.done;
    assert.match(ended.text, /"error"/, 'the stream ends with an error event');
    assert.match(ended.text, /data: \[DONE\]/);
    const back = await waitFor('a new router serving', async () => {
      const h = await getJson(`${server.url}/health`);
      return h.status === 200 && pidOf(h.body.processes, 'router') !== frozen && h.body.processes;
    }, 20000);
    assert.ok(!pidAlive(frozen) || await waitFor('the frozen router to be gone', () => !pidAlive(frozen), 5000));
    frozen = undefined;
    // the workers were healthy all along: the new router keeps them
    for (const role of ['llm', 'visual', 'frontend'])
      assert.equal(pidOf(back, role), pidOf(before, role), `${role} was not restarted`);
    const ok = await postJson(`${server.url}/v1/completions`, { prompt: 'again', max_tokens: 2 });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  } finally {
    if (frozen && pidAlive(frozen)) process.kill(frozen, 'SIGCONT');
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
