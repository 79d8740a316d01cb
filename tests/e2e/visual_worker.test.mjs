// visual_worker.test.mjs - the visual worker serves a Qwen3-VL checkpoint as
// published: vlmd-visual, started with the arguments `vlmd args visual`
// gives it, loads the tower (model.visual.*: learned position embeddings,
// DeepStack mergers), runs its stress-reserve and reports ready with the
// device bytes it holds and its batch. The router and the frontend run
// beside it (their /health and /memory_stats show it); no engine is
// started, so the service as a whole stays 'starting'.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, FIXTURES, waitFor, getJson } from './harness.mjs';

// The arguments vlmd-ROLE gets (`vlmd args` quotes each one for a shell).
function roleArgs(role, flags) {
  const line = execFileSync(`${BIN}/vlmd`, ['args', role, ...flags], { encoding: 'utf8' }).trim();
  return line.match(/'[^']*'/g).map((a) => a.slice(1, -1));
}

function start(role, flags) {
  const child = spawn(`${BIN}/vlmd-${role}`, roleArgs(role, flags), { stdio: ['ignore', 'ignore', 'pipe'] });
  const p = { role, child, stderr: '', exited: null };
  child.stderr.on('data', (d) => { p.stderr += d; });
  child.on('exit', (code, signal) => { p.exited = { code, signal }; });
  return p;
}

async function stop(p) {
  if (!p.exited) p.child.kill('SIGTERM');
  await waitFor(`${p.role} to exit`, () => p.exited, 20000);
  return p.exited;
}

test('vlmd-visual serves qwen3_vl: ready with its reservation', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-e2e-visual-'));
  // 71680 pixels: images of up to 70 tokens (the fixture's images are 70), two a batch
  const flags = ['--model', `${FIXTURES}/qwen3_vl`, '--router-endpoint', `ipc://${dir}/router.sock`,
    '--embed-arena-path', `${dir}/arena`, '--embed-arena-mb', '16', '--vision-max-pixels', '71680',
    '--visual-batch-size', '2', '--port', '0', '--device', 'cpu', '--heartbeat-ms', '50'];
  const procs = [start('router', flags), start('visual', flags), start('frontend', flags)];
  try {
    const frontend = procs[2];
    const url = await waitFor('the frontend to listen', () => {
      if (frontend.exited) throw new Error(`the frontend exited: ${frontend.stderr}`);
      return frontend.stderr.match(/listening on (http:\/\/\S+)/)?.[1];
    });
    const visual = await waitFor('the visual worker to be ready', async () => {
      for (const p of procs)
        if (p.exited) throw new Error(`${p.role} exited ${JSON.stringify(p.exited)}: ${p.stderr.slice(-2000)}`);
      const health = (await getJson(`${url}/health`)).body;
      return health.processes.find((p) => p.role === 'visual' && p.state === 'ready');
    }, 60000);
    assert.ok(visual.reserved_bytes > 0, `it reports the bytes it holds: ${visual.reserved_bytes}`);
    assert.match(visual.device, /^cpu/);
    const mem = (await getJson(`${url}/memory_stats`)).body;
    assert.equal(Number(mem.visual.memory.reserved_bytes), visual.reserved_bytes);
    assert.equal(Number(mem.visual.memory.batch_images), 2);
    assert.equal(Number(mem.visual.memory.batch_tokens), 140, 'two images of 70 tokens');
    // on the CPU the workspace sized from the shapes is the reservation (docs/MEMORY.md §1)
    assert.equal(mem.visual.memory.stress, 'shapes');
    assert.match(procs[1].stderr, /2 images of up to 70 tokens per batch/, 'the batch it reserved for');
    assert.match(procs[1].stderr, /Qwen3VLForConditionalGeneration vision tower: depth 4, width 32/);
  } finally {
    for (const p of [...procs].reverse())
      assert.deepEqual(await stop(p), { code: 0, signal: null }, `${p.role}: ${p.stderr.slice(-2000)}`);
    rmSync(dir, { recursive: true, force: true });
  }
});
