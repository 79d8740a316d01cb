// deploy.test.mjs - deploy/ without the launcher. supervisord (Debian's) runs
// deploy/supervisor/vlmd.conf as written, with a tensor-parallel group of two engine
// ranks (numprocs=2) on the CPU: the group forms through the router, serves the reference
// answers, and when a rank's process is killed the other fails at once and exits, so
// supervisord restarts both into a new group that serves again. The systemd units, the rank
// template's instances included, pass `systemd-analyze verify`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { BIN, FIXTURES, SCALE, getJson, postJson, waitFor, pidAlive, makeDecoder } from './harness.mjs';

const DEPLOY = fileURLToPath(new URL('../../deploy/', import.meta.url));
const MODEL = `${FIXTURES}/qwen2`;

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const ranksOf = (health) => health.processes.filter((p) => p.role === 'llm');

test('supervisord runs a tensor-parallel group from deploy/supervisor/vlmd.conf and restarts it whole', async () => {
  const dir = mkdtempSync(`${tmpdir()}/vlmd-supervisor-`);
  const port = await freePort();
  const flags = [`--model ${MODEL}`, `--router-endpoint ipc://${dir}/router.sock`,
    `--embed-arena-path ${dir}/embeddings.arena`, `--port ${port}`, '--device cpu',
    '--tensor-parallel-size 2', '--heartbeat-ms 100', '--heartbeat-timeout-ms 1000'].join(' ');
  // the shipped file, with the binaries where this build put them and two engine ranks
  const programs = readFileSync(`${DEPLOY}/supervisor/vlmd.conf`, 'utf8')
    .replaceAll('/usr/local/bin', BIN).replace('numprocs=1', 'numprocs=2');
  assert.match(programs, /--engine-process %\(process_num\)d/);
  writeFileSync(`${dir}/supervisord.conf`, [
    '[supervisord]', 'nodaemon=true', `logfile=${dir}/supervisord.log`, `pidfile=${dir}/supervisord.pid`,
    `childlogdir=${dir}`, `environment=VLMD_FLAGS="${flags}"`, '', programs].join('\n'));
  const sup = spawn('supervisord', ['-c', `${dir}/supervisord.conf`], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  sup.stdout.on('data', (d) => { out += d; });
  sup.stderr.on('data', (d) => { out += d; });
  const logs = () => readdirSync(dir).filter((f) => f.endsWith('.log'))
    .map((f) => `--- ${f}\n${readFileSync(`${dir}/${f}`, 'utf8').slice(-1500)}`).join('\n') + out;
  const url = `http://127.0.0.1:${port}`;
  const seen = [];
  try {
    const ready = async () => {
      const h = (await getJson(`${url}/health`)).body;
      const r = ranksOf(h);
      return h.status === 'ok' && r.length === 2 && r.every((p) => p.state === 'ready') && r;
    };
    const first = await waitFor('the group ready under supervisord', ready, 60000 * SCALE, 200)
      .catch((e) => assert.fail(`${e.message}\n${logs()}`));
    seen.push(...first.map((p) => p.pid));
    const ref = JSON.parse(readFileSync(`${MODEL}/reference.json`, 'utf8'));
    const decode = makeDecoder(JSON.parse(readFileSync(`${MODEL}/tokenizer.json`, 'utf8')));
    const c = ref.cases[0];
    const ask = () => postJson(`${url}/v1/completions`,
      { prompt: c.input_ids, max_tokens: c.greedy_continuation.length, temperature: 0 }, { timeoutMs: 30000 });
    let r = await ask();
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.choices[0].text, decode(c.greedy_continuation));

    process.kill(first[1].pid, 'SIGKILL');
    const again = await waitFor('a new group ready', async () => {
      const g = await ready();
      return g && g.every((p, k) => p.pid !== first[k].pid) && g;
    }, 60000 * SCALE, 200).catch((e) => assert.fail(`${e.message}\n${logs()}`));
    seen.push(...again.map((p) => p.pid));
    assert.ok(!pidAlive(first[0].pid), 'rank 0 of the old group exited when rank 1 was gone');
    r = await ask();
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.choices[0].text, decode(c.greedy_continuation), 'the new group serves the same');
  } finally {
    sup.kill('SIGTERM');
    await waitFor('supervisord to stop everything', () => sup.exitCode !== null || sup.signalCode, 40000 * SCALE);
    for (const pid of seen) assert.ok(!pidAlive(pid), `pid ${pid} is gone`);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the systemd units and the rank template\'s instances pass systemd-analyze verify', () => {
  const dir = mkdtempSync(`${tmpdir()}/vlmd-systemd-`);
  try {
    for (const f of readdirSync(`${DEPLOY}/systemd`))
      writeFileSync(`${dir}/${f}`, readFileSync(`${DEPLOY}/systemd/${f}`, 'utf8').replaceAll('/usr/local/bin', BIN));
    const template = readFileSync(`${dir}/vlmd-llm@.service`, 'utf8');
    assert.match(template, /vlmd args llm \$VLMD_FLAGS --engine-process %i/);
    assert.match(readFileSync(`${dir}/vlmd.target`, 'utf8'), /Wants=.*vlmd-llm@0\.service/);
    const units = ['vlmd.target', 'vlmd-router.service', 'vlmd-visual.service', 'vlmd-frontend.service',
      'vlmd-llm@0.service', 'vlmd-llm@1.service'];
    const v = spawnSync('systemd-analyze', ['verify', '--man=no', ...units], { cwd: dir, encoding: 'utf8' });
    assert.equal(v.status, 0, v.stderr);
    assert.equal(v.stderr.trim(), '', 'no warning about any unit');
    // what the template's ExecStart gives instance 3 of two engines of two ranks: engine 1's rank 1
    const argsOf = (p) => spawnSync(`${BIN}/vlmd`, ['args', 'llm', '--model', MODEL, '--router-endpoint',
      'ipc:///run/vlmd/router.sock', '--tensor-parallel-size', '2', '--data-parallel-size', '2',
      '--engine-process', String(p)], { encoding: 'utf8' });
    const args = argsOf(3);
    assert.equal(args.status, 0, args.stderr);
    assert.match(args.stdout, /'--rank=1'/);
    assert.match(args.stdout, /'--data-parallel-rank=1'/);
    assert.match(args.stdout, /'--tensor-parallel-size=2'/);
    assert.match(argsOf(2).stdout, /'--rank=0'.*'--data-parallel-rank=1'|'--data-parallel-rank=1'.*'--rank=0'/);
    const past = argsOf(4);
    assert.equal(past.status, 2, 'an instance past the engines\' processes is refused');
    assert.match(past.stderr, /--engine-process 4/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
