// starvation.test.mjs - allowed but costly work from one client does not starve
// another's. Images that are costly to decode (all-zero PNGs of 16 megapixels: 47
// KB each, under --max-image-pixels; docs/SECURITY.md, Costly images): the visual
// worker serves requests in proportion to what their images cost, so a small
// image sent after them is answered before them; a job that waited past
// --image-wait-ms (its request has failed) is dropped unencoded; the worker's
// threads run at --visual-nice. Long requests that fill the KV cache's room: by
// default (--admission-policy fair) a short request passes those still queued
// (docs/MEMORY.md §3).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import zlib from 'node:zlib';
import { FIXTURES, startServer, stopServer, postJson, getJson, waitFor } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2_vl`;

const CRC = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
const crc32 = (buf) => {
  let c = 0xffffffff;
  for (const b of buf) c = CRC[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
};
const chunk = (type, data) => {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const body = Buffer.concat([Buffer.from(type), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([len, body, crc]);
};
// An RGB PNG of the given compressed scanlines; tag (a tEXt chunk) makes each one's
// bytes, and so its hash, its own: nothing is shared through the embedding arena.
function png(side, idat, tag) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(side, 0);
  ihdr.writeUInt32BE(side, 4);
  ihdr[8] = 8;
  ihdr[9] = 2;
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr),
    chunk('tEXt', Buffer.from(`k\0${tag}`)), chunk('IDAT', idat), chunk('IEND', Buffer.alloc(0))]);
}
const SIDE = 4000;
const ZERO_IDAT = zlib.deflateSync(Buffer.alloc((SIDE * 3 + 1) * SIDE), { level: 9 });
const uri = (bytes) => `data:image/png;base64,${bytes.toString('base64')}`;
const chat = (images, text = 'what is this?') => ({ messages: [{ role: 'user', content: [
  ...images.map((b) => ({ type: 'image_url', image_url: { url: uri(b) } })), { type: 'text', text }] }],
max_tokens: 1, temperature: 0 });
const costly = (n, tag) => Array.from({ length: n }, (_, i) => png(SIDE, ZERO_IDAT, `${tag}-${i}`));

const counters = async (url, role) => (await getJson(`${url}/memory_stats`)).body[role].counters;

test('a small image sent after costly ones is answered before them; the visual worker runs at --visual-nice', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--visual-batch-size', '1',
    '--image-wait-ms', '600000']);
  try {
    // four requests of four costly images each, all queued at the visual worker
    const done = [];
    const attackers = Array.from({ length: 4 }, (_, k) =>
      postJson(`${server.url}/v1/chat/completions`, chat(costly(4, `a${k}`)), { timeoutMs: 600000 })
        .then((r) => { done.push(k); return r; }));
    await waitFor('the costly requests to wait for their images', async () =>
      (await counters(server.url, 'router')).requests_waiting_for_images === 4, 30000);
    const small = readFileSync(`${MODEL}/image_84x56.png`);
    const r = await postJson(`${server.url}/v1/chat/completions`, chat([small]), { timeoutMs: 600000 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const before = done.length;
    // first come, first served, it would wait for all 16 costly images: every costly
    // request would be answered first
    assert.ok(before <= 1, `${before} of the 4 costly requests were answered before the small image's`);
    for (const a of await Promise.all(attackers)) assert.equal(a.status, 200, JSON.stringify(a.body));

    // every thread that decodes and encodes runs at --visual-nice (10 by default)
    const { pid } = (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'visual');
    const nice = (stat) => Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[16]);
    assert.equal(nice(readFileSync(`/proc/${pid}/stat`, 'utf8')), 10, 'the visual worker\'s main thread');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('images whose requests gave up (--image-wait-ms) are dropped, not encoded', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--visual-batch-size', '1',
    '--image-wait-ms', '1000']);
  try {
    const results = await Promise.all(Array.from({ length: 4 }, (_, k) =>
      postJson(`${server.url}/v1/chat/completions`, chat(costly(6, `b${k}`)), { timeoutMs: 60000 })));
    for (const r of results) {
      assert.equal(r.status, 503, JSON.stringify(r.body));
      assert.match(r.body.error.message, /--image-wait-ms/);
    }
    // 24 jobs: each is encoded, or dropped once it has waited past 1 s
    const v = await waitFor('the visual worker to empty its queue', async () => {
      const c = await counters(server.url, 'visual');
      return c.images_encoded + (c.images_shed ?? 0) === 24 && c;
    }, 60000);
    assert.ok(v.images_shed > 0, `some jobs were dropped: ${JSON.stringify(v)}`);
    // the server keeps serving images
    const small = readFileSync(`${MODEL}/image_84x56.png`);
    assert.equal((await postJson(`${server.url}/v1/chat/completions`, chat([small]))).status, 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

// A request whose answer is not awaited: { done, body, abort() }.
function pending(url, body) {
  const p = { done: false, status: 0 };
  p.req = http.request(url, { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
    res.resume();
    res.on('end', () => { p.done = true; p.status = res.statusCode; });
  });
  p.req.on('error', () => { p.done = true; });
  p.req.end(JSON.stringify(body));
  return p;
}

test('by default a short request passes long ones queued for KV room (one client cannot hold back another)', async () => {
  // room for two of the long requests at a time: 2 x (prompt + 1000) of 2100 tokens
  const server = await startServer(['--model', `${FIXTURES}/qwen2`, '--port', '0', '--max-total-token-num', '2100',
    '--max-model-len', '1024', '--heartbeat-ms', '50']);
  const long = [];
  try {
    for (let i = 0; i < 8; i++)
      long.push(pending(`${server.url}/v1/completions`, { prompt: `a long answer ${i}`, max_tokens: 1000,
        ignore_eos: true, temperature: 0 }));
    await waitFor('long requests to queue for room', async () =>
      (await counters(server.url, 'router')).requests_queued >= 4, 30000);
    const t0 = Date.now();
    const r = await postJson(`${server.url}/v1/completions`, { prompt: 'short', max_tokens: 1 }, { timeoutMs: 120000 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const answered = long.filter((p) => p.done).length;
    // first come, first served it waits for the six long requests queued before it: four
    // or more of the eight have ended by then
    assert.ok(answered <= 1, `${answered} long requests ended before the short one (${Date.now() - t0} ms)`);
  } finally {
    for (const p of long) p.req.destroy();
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
