// supervision.test.mjs - the four processes come up in order, report to
// /health, survive a killed worker (a visual worker is back to images within
// 10 s), and leave nothing behind on SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { BIN, FIXTURES, startServer, stopServer, runToExit, waitFor, getJson, postJson, pidAlive } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2_vl`;
const FAST = ['--heartbeat-ms', '100', '--heartbeat-timeout-ms', '1000', '--restart-backoff-ms', '100'];
const byRole = (health, role) => health.processes.find((p) => p.role === role);

test('serve: ready, killed worker restarts, SIGTERM leaves nothing behind', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', ...FAST]);
  const seenPids = new Set();
  let socketPath;
  try {
    const { status, body: health } = await getJson(`${server.url}/health`);
    assert.equal(status, 200);
    assert.equal(health.status, 'ok');
    assert.deepEqual(health.processes.map((p) => p.role).sort(), ['frontend', 'llm', 'router', 'visual']);
    for (const p of health.processes) {
      assert.equal(p.state, 'ready', `${p.role} is ${p.state}`);
      assert.ok(p.pid > 0 && pidAlive(p.pid), `${p.role} pid ${p.pid} is running`);
      // A flag given to the launcher reaches every process that reads it.
      assert.equal(p.config['heartbeat-ms'], '100', `${p.role} got --heartbeat-ms`);
      assert.equal(p.config.model, MODEL, `${p.role} got --model`);
      seenPids.add(p.pid);
    }
    // ... and only those: the visual worker does not read --port, the frontend does.
    assert.equal(byRole(health, 'visual').config.port, undefined);
    assert.equal(byRole(health, 'frontend').config.port, '0');
    assert.equal(byRole(health, 'llm').config.device, 'auto');

    const endpoint = byRole(health, 'router').listen_url;
    assert.match(endpoint, /^ipc:\/\/.+\/router\.sock$/);
    socketPath = endpoint.slice('ipc://'.length);
    assert.ok(existsSync(socketPath), `router socket ${socketPath} exists while serving`);

    const models = await getJson(`${server.url}/v1/models`);
    assert.equal(models.status, 200);
    assert.equal(models.body.data[0].id, 'qwen2_vl');
    assert.equal(models.body.data[0].max_model_len, 4096);

    const missing = await getJson(`${server.url}/v1/nope`);
    assert.equal(missing.status, 404);
    assert.equal(typeof missing.body.error.message, 'string');

    // Kill the visual worker: reported down, then restarted and ready with a new pid.
    const visualPid = byRole(health, 'visual').pid;
    process.kill(visualPid, 'SIGKILL');
    // down until its successor says hello (a slow poll may see that one starting instead)
    const down = await waitFor('visual reported down', async () => {
      const h = (await getJson(`${server.url}/health`)).body;
      const v = byRole(h, 'visual');
      return (v.state === 'down' || (v.pid !== visualPid && v.state === 'starting')) && h;
    }, 10000, 20);
    assert.notEqual(down.status, 'ok');
    assert.equal(byRole(down, 'llm').state, 'ready', 'the engine keeps serving');
    const back = await waitFor('visual ready again', async () => {
      const h = (await getJson(`${server.url}/health`)).body;
      const v = byRole(h, 'visual');
      return v.state === 'ready' && v.pid !== visualPid && h;
    }, 15000);
    assert.equal(back.status, 'ok');
    assert.equal(byRole(back, 'visual').restarts, 1);
    for (const p of back.processes) seenPids.add(p.pid);
  } finally {
    const logBeforeStop = server.stderr.length;
    const exit = await stopServer(server);
    assert.deepEqual(exit, { code: 0, signal: null }, server.stderr.slice(-3000));
    // Every process stops cleanly: no crash, no SIGKILL, no non-zero exit.
    const stopLog = server.stderr.slice(logBeforeStop);
    assert.doesNotMatch(stopLog, /killed by signal|exited with status|Assertion|did not stop/, stopLog);
    for (const role of ['router', 'visual', 'llm', 'frontend']) {
      assert.match(stopLog, new RegExp(`vlmd-${role} \\(pid \\d+\\) stopped`), `${role} stopped`);
    }
  }
  for (const pid of seenPids) assert.ok(!pidAlive(pid), `pid ${pid} is gone after SIGTERM`);
  assert.ok(!existsSync(socketPath), 'no socket file is left');
  assert.ok(!existsSync(socketPath.replace(/\/router\.sock$/, '')), 'the runtime directory is removed');
});

test('a killed visual worker encodes images again within 10 s (the demo model, as make demo serves it)', async (t) => {
  // Images of up to 1280 tokens, two per batch: that worst case through the tower takes a minute on a
  // loaded 2-core CPU; the CPU's stress-reserve sizes it from the shapes instead (docs/MEMORY.md).
  const model = mkdtempSync(`${tmpdir()}/vlmd-demo-`);
  execFileSync(`${BIN}/vlmd-make-demo-model`, [model]);
  const server = await startServer(['--model', model, '--port', '0', ...FAST], { readyTimeoutMs: 120000 });
  const ask = (png) => postJson(`${server.url}/v1/chat/completions`, { max_tokens: 2, messages: [{ role: 'user',
    content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${png.toString('base64')}` } },
      { type: 'text', text: 'what is it?' }] }] }, { timeoutMs: 20000 });
  const visual = async () => (await getJson(`${server.url}/memory_stats`)).body.visual;
  try {
    assert.equal((await ask(readFileSync(`${MODEL}/image_84x56.png`))).status, 200);
    const before = await visual();
    const { pid } = byRole((await getJson(`${server.url}/health`)).body, 'visual');
    const t0 = Date.now();
    process.kill(pid, 'SIGKILL');
    // Another image than before: the arena still holds the first one's embeddings.
    const other = readFileSync(`${MODEL}/image_150x100.png`);
    await waitFor('an image encoded by a new visual worker', async () => {
      const v = byRole((await getJson(`${server.url}/health`)).body, 'visual');
      return v.state === 'ready' && v.pid !== pid && (await ask(other)).status === 200;
    }, 30000);
    const elapsed = Date.now() - t0;
    t.diagnostic(`images again ${elapsed} ms after the kill`);
    assert.ok(elapsed < 10000, `images again ${elapsed} ms after the kill`);
    // Counters travel with the heartbeats.
    const after = await waitFor('the new worker\'s counters', async () => {
      const v = await visual();
      return v.counters.images_encoded !== undefined && v;
    }, 10000);
    assert.equal(after.counters.images_encoded, 1, 'the new worker encoded the image');
    assert.equal(after.counters.device_allocations_since_ready, 0);
    assert.equal(after.reserved_bytes, before.reserved_bytes, 'the same reservation');
    assert.equal(after.memory.batch_tokens, 2560, 'two images of 1280 tokens');
    assert.equal(after.memory.stress, 'shapes');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    rmSync(model, { recursive: true, force: true });
  }
});

test('serve: an unknown flag is refused with exit 2 and names the flag', async () => {
  const r = await runToExit(['serve', '--model', MODEL, '--no-such-flag', '1']);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--no-such-flag/);
});

test('serve: a directory without config.json is refused before anything starts', async () => {
  const r = await runToExit(['serve', '--model', `${FIXTURES}/does-not-exist`]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /config\.json/);
});

test('serve: a worker that cannot start stops the server with its last log lines', async () => {
  // A context longer than the KV cache can hold is a start-up error of the engine (exit 2):
  // the launcher does not retry it, stops everything and shows why.
  const r = await runToExit(['serve', '--model', MODEL, '--port', '0', '--max-model-len', '4096',
    '--max-total-token-num', '64', ...FAST]);
  assert.equal(r.code, 1, r.stderr);
  assert.match(r.stderr, /last log lines of vlmd-llm/);
  assert.match(r.stderr, /--max-model-len 4096 does not fit a KV cache of 64 tokens/);
});

async function freePort() {
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

test('serve: the processes can talk over tcp:// instead of ipc://', async () => {
  const endpoint = `tcp://127.0.0.1:${await freePort()}`;
  const server = await startServer(['--model', MODEL, '--port', '0', '--router-endpoint', endpoint, ...FAST]);
  try {
    // (with 100 ms heartbeats and a 1 s timeout, a loaded machine can show a late one as a
    // 503 right after the ready line: the check is that it answers 200 over tcp://)
    const { body } = await waitFor('/health 200 over tcp://', async () => {
      const r = await getJson(`${server.url}/health`);
      return r.status === 200 && r;
    }, 10000);
    assert.equal(byRole(body, 'router').listen_url, endpoint);
    for (const p of body.processes) assert.equal(p.config['router-endpoint'], endpoint, p.role);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null });
  }
});

test('restart counts survive a router restart: the launcher owns them', async () => {
  const server = await startServer(['--model', `${FIXTURES}/qwen2`, '--port', '0', ...FAST]);
  const health = async () => (await getJson(`${server.url}/health`)).body;
  try {
    for (let i = 1; i <= 2; i++) {
      const pid = byRole(await health(), 'llm').pid;
      process.kill(pid, 'SIGKILL');
      await waitFor(`the engine's restart ${i}`, async () => {
        const llm = byRole(await health(), 'llm');
        return llm.state === 'ready' && llm.pid !== pid && llm.restarts === i;
      }, 20000);
    }
    const routerPid = byRole(await health(), 'router').pid;
    process.kill(routerPid, 'SIGKILL');
    const back = await waitFor('a new router', async () => {
      const h = await getJson(`${server.url}/health`);
      return h.status === 200 && byRole(h.body, 'router').pid !== routerPid && h.body;
    }, 20000);
    // the new router learns the counts from the launcher (it saw no restart itself)
    const counted = await waitFor('the counts from the launcher', async () => {
      const h = await health();
      return byRole(h, 'router').restarts === 1 && byRole(h, 'llm').restarts === 2 && h;
    }, 5000).catch(() => back);
    assert.equal(byRole(counted, 'router').restarts, 1, 'the router was restarted once');
    assert.equal(byRole(counted, 'llm').restarts, 2, 'the engine twice, before the router was');
    assert.equal(byRole(counted, 'visual').restarts, 0);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('a SIGKILLed launcher leaves its runtime directory behind; the next vlmd serve removes it', async () => {
  const base = mkdtempSync(`${tmpdir()}/vlmd-xdg-`);
  const env = { XDG_RUNTIME_DIR: base };
  const args = ['--model', `${FIXTURES}/qwen2`, '--port', '0', ...FAST];
  const runtimeDir = async (server) => byRole((await getJson(`${server.url}/health`)).body, 'router')
    .listen_url.replace(/^ipc:\/\//, '').replace(/\/router\.sock$/, '');
  const alive = await startServer(args, { env });
  let killed, next;
  try {
    killed = await startServer(args, { env });
    const killedDir = await runtimeDir(killed);
    const children = (await getJson(`${killed.url}/health`)).body.processes.map((p) => p.pid);
    killed.child.kill('SIGKILL');
    await waitFor('the killed launcher\'s children to follow it', () => children.every((p) => !pidAlive(p)), 15000);
    assert.ok(existsSync(`${killedDir}/launcher.pid`), 'SIGKILL left the directory behind');
    const aliveDir = await runtimeDir(alive);
    next = await startServer(args, { env });
    assert.ok(!existsSync(killedDir), `${killedDir} was removed by the next launcher`);
    assert.ok(existsSync(aliveDir), 'a running instance\'s directory is left alone');
    // Three instances share the loaded machine under a 1 s heartbeat timeout: the survivor may be
    // restarting a worker at this instant, and serving again is what matters.
    await waitFor('the running instance to keep serving',
      async () => (await getJson(`${alive.url}/health`)).status === 200, 20000);
  } finally {
    for (const s of [next, alive]) if (s) assert.deepEqual(await stopServer(s), { code: 0, signal: null });
    rmSync(base, { recursive: true, force: true });
  }
});
