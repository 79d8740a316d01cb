// arena.test.mjs - the embedding arena's room (issue 36, items 2 and 5).
// Its file's pages are reserved when vlmd starts: where there is no room (a
// small tmpfs, Docker's 64 MiB /dev/shm) vlmd serve refuses at once with the
// numbers and the flags, or puts its runtime directory where there is room;
// what the filesystem gives others later cannot be the arena's. Requests
// that each need much of the arena take their room whole, in turn, and the
// log says when the arena is the limit.
//
// A small tmpfs is mounted in vlmd's own mount namespace (unshare -m as root,
// else a user namespace); where neither is permitted, the refusal runs under
// a file-size limit instead (prlimit --fsize), and the tests that need a
// real small filesystem say that they were skipped and why.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, openSync, writeSync } from 'node:fs';
import { FIXTURES, SCALE, startServer, stopServer, postJson, getJson, runToExit } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2_vl`; // 512 arena bytes an image token

// The command that runs vlmd with a tmpfs of `mib` MiB over each directory of
// mounts ([[dir, mib], ...]), in a mount namespace of its own; null where this
// machine permits none.
const tmpfsWrap = (() => {
  for (const ns of [['-m'], ['-Urm']]) {
    const r = spawnSync('unshare', [...ns, 'sh', '-c', 'mount -t tmpfs -o size=1m tmpfs /dev/shm'],
      { stdio: 'ignore' });
    if (r.status === 0) {
      return (mounts) => ['unshare', ...ns, 'sh', '-c',
        `${mounts.map(([dir, mib]) => `mount -t tmpfs -o size=${mib}m tmpfs ${dir}`).join(' && ')} && exec "$0" "$@"`];
    }
  }
  return null;
})();
const NO_TMPFS = tmpfsWrap ? false
  : 'needs a small tmpfs of its own: neither unshare -m nor a user namespace is permitted here';
const NO_XDG = { XDG_RUNTIME_DIR: '' }; // the runtime directory's choice: /dev/shm, then /tmp

// A gray 448x448 baseline JPEG (256 tokens at the fixture's size: 128 KiB of
// the arena), its bytes made unique by a comment holding id.
function grayJpeg(id, width = 448, height = 448) {
  const seg = (marker, body) => Buffer.concat([Buffer.from([0xff, marker, (body.length + 2) >> 8,
    (body.length + 2) & 0xff]), Buffer.from(body)]);
  const huff = (cls) => seg(0xc4, [cls << 4, 1, ...Array(15).fill(0), 0]);
  const blocks = Math.ceil(width / 8) * Math.ceil(height / 8);
  return Buffer.concat([Buffer.from([0xff, 0xd8]), seg(0xfe, Buffer.from(`vlmd arena test ${id}`)),
    seg(0xdb, [0, ...Array(64).fill(1)]),
    seg(0xc0, [8, height >> 8, height & 0xff, width >> 8, width & 0xff, 1, 1, 0x11, 0]),
    huff(0), huff(1), seg(0xda, [1, 1, 0, 0, 63, 0]), Buffer.alloc(Math.ceil(blocks / 4)),
    Buffer.from([0xff, 0xd9])]);
}

// A chat with n images, ids first..first+n-1.
const imagesChat = (first, n) => ({ max_tokens: 2, temperature: 0, messages: [{ role: 'user', content: [
  ...Array.from({ length: n }, (_, i) => ({ type: 'image_url',
    image_url: { url: `data:image/jpeg;base64,${grayJpeg(first + i).toString('base64')}` } })),
  { type: 'text', text: 'What is in these images?' }] }] });

const processOf = async (server, role) => (await getJson(`${server.url}/health`)).body.processes
  .find((p) => p.role === role);
// The directory the router's socket (and the arena beside it) is in.
const runtimeDirOf = async (server) => (await processOf(server, 'router')).listen_url
  .replace('ipc://', '').replace(/\/router\.sock$/, '');

const FLAGS = [/--embed-arena-mb/, /--runtime-dir/, /--embed-arena-path/];

test('no room for the embedding arena: vlmd serve refuses at once, naming the sizes and the flags', async (t) => {
  const serve = ['serve', '--model', MODEL, '--port', '0'];
  const started = Date.now();
  if (tmpfsWrap) {
    t.diagnostic('small filesystems: tmpfs mounts in a mount namespace of its own');
    // Docker's 64 MiB /dev/shm, and a /tmp as small: the default 256 MiB arena fits neither
    const none = await runToExit(serve, 15000 * SCALE, { env: NO_XDG, wrap: tmpfsWrap([['/dev/shm', 64], ['/tmp', 64]]) });
    assert.equal(none.code, 2, `refused as a configuration error: ${JSON.stringify(none)}`);
    for (const re of [/needs 256 MiB/, /\/dev\/shm: 64 MiB free/, /\/tmp: 64 MiB free/, ...FLAGS])
      assert.match(none.stderr, re);
    // a --runtime-dir on a small filesystem: its reservation finds no room
    const given = await runToExit([...serve, '--runtime-dir', '/dev/shm/vlmd-given'], 15000 * SCALE,
      { wrap: tmpfsWrap([['/dev/shm', 64]]) });
    assert.equal(given.code, 2, JSON.stringify(given));
    for (const re of [/embedding arena \/dev\/shm\/vlmd-given\/embeddings.arena needs 256 MiB/,
      /finds 64 MiB free \(No space left on device\)/, ...FLAGS])
      assert.match(given.stderr, re);
  } else {
    t.diagnostic(`small filesystems: the file-size limit stands in for them (${NO_TMPFS})`);
    const limited = await runToExit(serve, 15000 * SCALE, { env: NO_XDG, wrap: ['prlimit', `--fsize=${64 << 20}`] });
    assert.equal(limited.code, 2, JSON.stringify(limited));
    for (const re of [/needs 256 MiB/, /\/tmp: 64 MiB under the file-size limit/, ...FLAGS])
      assert.match(limited.stderr, re);
  }
  assert.ok(Date.now() - started < 10000, 'at once, before any process starts');
});

test("Docker's 64 MiB /dev/shm: the runtime directory goes under /tmp, said in the log, and images are served",
  { skip: NO_TMPFS }, async () => {
    const server = await startServer(['--model', MODEL, '--port', '0'],
      { env: NO_XDG, wrap: tmpfsWrap([['/dev/shm', 64]]) });
    try {
      assert.match(server.stderr, /\/dev\/shm: 64 MiB free: less than the embedding arena's 256 MiB \(--embed-arena-mb\); the runtime directory goes under \/tmp/);
      assert.match(await runtimeDirOf(server), /^\/tmp\/vlmd-/);
      const r = await postJson(`${server.url}/v1/chat/completions`, imagesChat(0, 1), { timeoutMs: 30000 * SCALE });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });

// Before (issue 36) the arena was a sparse file: once others had the
// filesystem's room, the visual worker's first write into a page of the
// arena not yet written was a SIGBUS, and every image request failed.
test('the arena keeps its reserved room: a tmpfs filled by someone else after start, images still fill the whole arena',
  { skip: NO_TMPFS }, async () => {
    const server = await startServer(['--model', MODEL, '--port', '0', '--embed-arena-mb', '4'],
      { env: NO_XDG, wrap: tmpfsWrap([['/dev/shm', 8]]) });
    try {
      assert.match(await runtimeDirOf(server), /^\/dev\/shm\/vlmd-/, 'the arena is on the 8 MiB tmpfs');
      // someone else writes to the tmpfs until it is full (as vlmd's launcher sees it)
      const fd = openSync(`/proc/${server.child.pid}/root/dev/shm/filler`, 'w');
      let taken = 0;
      try {
        for (const chunk = Buffer.alloc(64 << 10, 1); ;) taken += writeSync(fd, chunk);
      } catch (e) {
        assert.equal(e.code, 'ENOSPC', e.message);
      } finally {
        closeSync(fd);
      }
      assert.ok(taken <= (4 << 20) + (64 << 10), `the filler took ${taken} bytes: the arena's 4 MiB are not free`);
      const visual = await processOf(server, 'visual');
      // 36 images of 128 KiB: the 4 MiB arena's every page written, some twice
      for (let round = 0; round < 3; round++) {
        const answers = await Promise.all(Array.from({ length: 4 }, (_, i) => postJson(`${server.url}/v1/chat/completions`,
          imagesChat(100 + (round * 4 + i) * 3, 3), { timeoutMs: 60000 * SCALE })));
        answers.forEach((r, i) => assert.equal(r.status, 200, `round ${round}, request ${i}: ${JSON.stringify(r.body)}`));
      }
      assert.equal((await processOf(server, 'visual')).pid, visual.pid, 'the visual worker was never killed');
      assert.doesNotMatch(server.stderr, /killed by signal/);
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });

// Item 5: eight requests of five images, each 640 KiB of a 1 MiB arena: one at
// a time fits. Each takes its room whole or waits holding none, in arrival
// order, so all are answered; the log says the arena is the limit.
test('requests that each need most of the arena take it in turn, all answered, and the log says the arena is the limit', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--embed-arena-mb', '1',
    '--max-images-per-request', '9', '--image-wait-ms', '120000']);
  try {
    const answers = await Promise.all(Array.from({ length: 8 }, (_, i) => postJson(`${server.url}/v1/chat/completions`,
      imagesChat(1000 + i * 5, 5), { timeoutMs: 150000 * SCALE })));
    answers.forEach((r, i) => assert.equal(r.status, 200, `request ${i}: ${JSON.stringify(r.body)}`));
    assert.match(server.stderr, /\d+ request\(s\) wait for room in the embedding arena: [\d.]+ of its 1\.0 MiB are held .* --embed-arena-mb/);
    const metrics = await fetch(`${server.url}/metrics`).then((r) => r.text());
    const waits = Number(metrics.match(/^vlmd_router_arena_waits_total\S* (\d+)$/m)?.[1]);
    assert.ok(waits >= 1, `requests counted as waiting for arena room: ${waits}`);
    // nine images need 1.1 MiB: refused at once, naming the flag
    const started = Date.now();
    const nine = await postJson(`${server.url}/v1/chat/completions`, imagesChat(2000, 9), { timeoutMs: 30000 * SCALE });
    assert.equal(nine.status, 400, JSON.stringify(nine.body));
    assert.match(nine.body.error.message, /--embed-arena-mb/);
    assert.ok(Date.now() - started < 10000, 'at once, not after --image-wait-ms');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
