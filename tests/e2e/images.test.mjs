// images.test.mjs - images in chat through the five processes: the frontend
// reads the data URI (or fetches an allowed URL), the router has the visual
// worker encode it into the shared arena, the engine splices the embeddings
// in. Checked against what Hugging Face transformers computed for the VL
// fixtures (and, for Qwen3-VL, the validated port of its code); bad images get a 400 naming the image and the server keeps
// serving; a visual worker killed mid-request gives a 503 and comes back.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { FIXTURES, startServer, stopServer, postJson, getJson, makeDecoder, waitFor } from './harness.mjs';

// Reads an F32 tensor from a safetensors file.
function readTensor(path, name) {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const t = header[name];
  const [from, to] = t.data_offsets;
  const bytes = buf.subarray(8 + n + from, 8 + n + to);
  return { shape: t.shape, data: new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)) };
}

// The reference log-probabilities of the token after the prompt, largest first.
function referenceTopLogprobs(model, c, k) {
  const { shape, data } = readTensor(`${FIXTURES}/${model}/reference.safetensors`, `case${c}.logits`);
  const [seq, vocab] = shape;
  const row = data.subarray((seq - 1) * vocab, seq * vocab);
  const max = Math.max(...row);
  const lse = max + Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0));
  return Array.from(row, (x) => x - lse).sort((a, b) => b - a).slice(0, k);
}

const dataUri = (bytes, type = 'image/png') => `data:${type};base64,${Buffer.from(bytes).toString('base64')}`;
const imageMessage = (url) => [{ role: 'user', content: [
  { type: 'image_url', image_url: { url } }, { type: 'text', text: 'What is in this image?' }] }];

for (const model of ['qwen2_vl', 'qwen2_5_vl']) {
  test(`${model}: image chats give the reference greedy text and logprobs`, async () => {
    const dir = `${FIXTURES}/${model}`;
    const reference = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
    const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
    const server = await startServer(['--model', dir, '--port', '0']);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
    try {
      for (const c of [2, 3]) {
        const want = reference.cases[c];
        const png = readFileSync(`${dir}/${want.image}`);
        const params = { model, messages: imageMessage(dataUri(png)), max_tokens: 12, temperature: 0,
          logprobs: true, top_logprobs: 5 };
        const r = await client.chat.completions.create(params);
        assert.equal(r.choices[0].message.content, decode(want.greedy_continuation), `case ${c}`);
        assert.equal(r.usage.prompt_tokens, want.input_ids.length, 'image tokens counted as HF does');
        const got = r.choices[0].logprobs.content[0].top_logprobs.map((t) => t.logprob);
        const ref = referenceTopLogprobs(model, c, 5);
        for (let i = 0; i < 5; i++)
          assert.ok(Math.abs(got[i] - ref[i]) < 1e-3, `case ${c}: top logprob ${i}: ${got[i]} vs ${ref[i]}`);

        let streamed = '';
        for await (const chunk of await client.chat.completions.create({ ...params, stream: true }))
          streamed += chunk.choices[0]?.delta?.content ?? '';
        assert.equal(streamed, r.choices[0].message.content, 'streamed equals non-streamed');
        // n choices of one image request: each choice sees the image
        const three = await client.chat.completions.create({ ...params, n: 3 });
        for (const choice of three.choices)
          assert.equal(choice.message.content, r.choices[0].message.content, `case ${c}: n = 3`);
        assert.equal(three.usage.prompt_tokens, want.input_ids.length);
      }
      // Two images (one repeated) in one request, and concurrent image requests.
      const png = readFileSync(`${dir}/${reference.cases[2].image}`);
      const two = await client.chat.completions.create({ model, max_tokens: 4, temperature: 0, messages: [{
        role: 'user', content: [{ type: 'image_url', image_url: { url: dataUri(png) } },
          { type: 'text', text: 'and' }, { type: 'image_url', image_url: { url: dataUri(png) } }] }] });
      assert.equal(two.choices[0].finish_reason, 'length');
      const many = await Promise.all(Array.from({ length: 6 }, (_, i) => client.chat.completions.create({
        model, max_tokens: 12, temperature: 0,
        messages: imageMessage(dataUri(readFileSync(`${dir}/${reference.cases[2 + (i % 2)].image}`))) })));
      many.forEach((r, i) => assert.equal(r.choices[0].message.content,
        decode(reference.cases[2 + (i % 2)].greedy_continuation), `concurrent request ${i}`));
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });
}

// Qwen3-VL: every fixture case as a chat, its messages as the reference rendered them (image
// items as data URIs, in place): Qwen3-VL-Instruct's template, the image token count the
// frontend and the visual worker share, the DeepStack features through the arena, case 3's two
// images in one turn; the text cases as chats too. Streamed and not, then all four at once.
test('qwen3_vl: chats with the case images (and the text cases) give the reference greedy text', async () => {
  const dir = `${FIXTURES}/qwen3_vl`;
  const reference = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
  const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
  // 71680 pixels: the fixture's images (70 tokens each) are the largest a request may send
  const server = await startServer(['--model', dir, '--port', '0', '--vision-max-pixels', '71680']);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const asChat = (messages) => messages.map((m) => ({ role: m.role, content: typeof m.content === 'string' ? m.content
    : m.content.map((p) => (p.type === 'image'
      ? { type: 'image_url', image_url: { url: dataUri(readFileSync(`${dir}/${p.image}`)) } }
      : { type: 'text', text: p.text })) }));
  try {
    const ask = (c, extra = {}) => client.chat.completions.create({ model: 'qwen3_vl', messages: asChat(c.messages),
      max_tokens: c.greedy_continuation.length, temperature: 0, ...extra });
    for (const [i, c] of reference.cases.entries()) {
      const want = decode(c.greedy_continuation);
      const r = await ask(c);
      assert.equal(r.choices[0].message.content, want, `case ${i}`);
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.equal(r.usage.prompt_tokens, c.input_ids.length, `case ${i}: the reference's prompt length`);
      let streamed = '';
      for await (const chunk of await ask(c, { stream: true }))
        streamed += chunk.choices[0]?.delta?.content ?? '';
      assert.equal(streamed, want, `case ${i}: streamed`);
    }
    const together = await Promise.all(reference.cases.map((c) => ask(c)));
    together.forEach((r, i) => assert.equal(r.choices[0].message.content,
      decode(reference.cases[i].greedy_continuation), `case ${i} among the others`));
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

// Every F32 tensor of a safetensors file: name -> { shape, data }.
function readTensors(path) {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const out = new Map();
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    assert.equal(t.dtype, 'F32', name);
    const bytes = buf.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
    out.set(name, { shape: t.shape, data: new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)) });
  }
  return out;
}

function writeTensors(path, tensors) {
  const header = {};
  let at = 0;
  for (const [name, t] of tensors) {
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [at, at + t.data.byteLength] };
    at += t.data.byteLength;
  }
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - (text.length % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(text.length));
  writeFileSync(path, Buffer.concat([len, Buffer.from(text), ...[...tensors.values()].map((t) => Buffer.from(t.data.buffer))]));
}

// A Qwen3-VL-MoE checkpoint as published: Qwen3-VL's tower (model.visual.*, its mergers'
// output widened to the text model's 128 by repeating their rows) in front of the qwen3_moe
// fixture's text model under model.language_model.*, each MoE layer's experts fused as
// mlp.experts.gate_up_proj [E, H, 2I] (gate columns, then up) and mlp.experts.down_proj
// [E, I, H]; Qwen3-VL's tokenizer, template and processor. Its text is the qwen3_moe model's:
// M-RoPE with equal rows is 1-D RoPE, and both renormalise the top-k.
function writeQwen3VlMoe(dir) {
  const moe = JSON.parse(readFileSync(`${FIXTURES}/qwen3_moe/config.json`, 'utf8'));
  const vl = JSON.parse(readFileSync(`${FIXTURES}/qwen3_vl/config.json`, 'utf8'));
  const H = moe.hidden_size, E = moe.num_experts, I = moe.moe_intermediate_size;
  const text = readTensors(`${FIXTURES}/qwen3_moe/model.safetensors`);
  const vision = readTensors(`${FIXTURES}/qwen3_vl/model.safetensors`);
  const out = new Map();
  for (const [name, t] of vision) {
    if (!name.startsWith('model.visual.')) continue;
    const widen = /merger.*\.linear_fc2\./.test(name);
    out.set(name, widen ? { shape: [2 * t.shape[0], ...t.shape.slice(1)],
      data: Float32Array.from([...t.data, ...t.data]) } : t);
  }
  for (const [name, t] of text) {
    if (name.includes('.mlp.experts.')) continue;
    out.set(name.replace(/^model\./, 'model.language_model.'), t);
  }
  for (let l = 0; l < moe.num_hidden_layers; l++) {
    if (moe.mlp_only_layers.includes(l)) continue;
    const gateUp = new Float32Array(E * H * 2 * I), down = new Float32Array(E * I * H);
    for (let e = 0; e < E; e++) {
      const w = (p) => text.get(`model.layers.${l}.mlp.experts.${e}.${p}_proj.weight`).data;
      const [g, u, d] = [w('gate'), w('up'), w('down')];
      for (let h = 0; h < H; h++)
        for (let r = 0; r < I; r++) {
          gateUp[(e * H + h) * 2 * I + r] = g[r * H + h];
          gateUp[(e * H + h) * 2 * I + I + r] = u[r * H + h];
          down[(e * I + r) * H + h] = d[h * I + r];
        }
    }
    out.set(`model.language_model.layers.${l}.mlp.experts.gate_up_proj`, { shape: [E, H, 2 * I], data: gateUp });
    out.set(`model.language_model.layers.${l}.mlp.experts.down_proj`, { shape: [E, I, H], data: down });
  }
  writeTensors(`${dir}/model.safetensors`, out);
  const textConfig = { ...moe, model_type: 'qwen3_vl_moe_text', architectures: undefined,
    rope_scaling: { rope_type: 'default', mrope_section: vl.text_config.rope_scaling.mrope_section, mrope_interleaved: true } };
  writeFileSync(`${dir}/config.json`, JSON.stringify({ ...vl, architectures: ['Qwen3VLMoeForConditionalGeneration'],
    model_type: 'qwen3_vl_moe', text_config: textConfig,
    vision_config: { ...vl.vision_config, out_hidden_size: H, model_type: 'qwen3_vl_moe' } }, null, 2));
  for (const f of ['tokenizer.json', 'tokenizer_config.json', 'preprocessor_config.json', 'generation_config.json'])
    copyFileSync(`${FIXTURES}/qwen3_vl/${f}`, `${dir}/${f}`);
}

// Qwen3-VL-MoE, composed from the same pieces: it loads as published, a completion from each
// qwen3_moe case's ids gives that model's greedy continuation, and an image chat is served
// (no reference: this model was never run elsewhere).
test('qwen3_vl_moe: the composed checkpoint serves text as its MoE text model does, and images', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-e2e-qwen3-vl-moe-'));
  writeQwen3VlMoe(dir);
  const server = await startServer(['--model', dir, '--port', '0', '--vision-max-pixels', '71680']);
  try {
    const moeRef = JSON.parse(readFileSync(`${FIXTURES}/qwen3_moe/reference.json`, 'utf8'));
    const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
    for (const [i, c] of moeRef.cases.entries()) {
      const { status, body } = await postJson(`${server.url}/v1/completions`, {
        prompt: c.input_ids, max_tokens: c.greedy_continuation.length, temperature: 0 }, { timeoutMs: 30000 });
      assert.equal(status, 200, JSON.stringify(body));
      assert.equal(body.choices[0].text, decode(c.greedy_continuation), `qwen3_moe case ${i}`);
    }
    const vlRef = JSON.parse(readFileSync(`${FIXTURES}/qwen3_vl/reference.json`, 'utf8'));
    const png = readFileSync(`${FIXTURES}/qwen3_vl/${vlRef.cases[2].image}`);
    const { status, body } = await postJson(`${server.url}/v1/chat/completions`, {
      messages: imageMessage(dataUri(png)), max_tokens: 6, temperature: 0 }, { timeoutMs: 30000 });
    assert.equal(status, 200, JSON.stringify(body));
    assert.equal(body.usage.prompt_tokens, vlRef.cases[2].input_ids.length, "Qwen3-VL's template and image tokens");
    assert.equal(body.usage.completion_tokens, 6);
    const llm = (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'llm');
    assert.equal(llm.state, 'ready');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    rmSync(dir, { recursive: true, force: true });
  }
});

// A PNG whose header says width x height (the rest is not a valid image).
function pngHeader(width, height) {
  const b = Buffer.alloc(64);
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13]).copy(b, 0);
  b.write('IHDR', 12, 'latin1');
  b.writeUInt32BE(width, 16);
  b.writeUInt32BE(height, 20);
  b[24] = 8; b[25] = 2;
  return b;
}

// A gray baseline JPEG, width x height, every block flat: one-code Huffman
// tables, so each 8x8 block is two 0 bits (DC difference 0, end of block).
// claim rewrites the frame header's size; scan replaces the coded data.
function grayJpeg(width, height, { claim = [width, height], scan } = {}) {
  const seg = (marker, body) => Buffer.concat([Buffer.from([0xff, marker, (body.length + 2) >> 8, (body.length + 2) & 0xff]), Buffer.from(body)]);
  const huff = (cls) => seg(0xc4, [cls << 4, 1, ...Array(15).fill(0), 0]);
  const blocks = Math.ceil(width / 8) * Math.ceil(height / 8);
  const data = scan ?? Buffer.alloc(Math.ceil(blocks / 4));
  return Buffer.concat([Buffer.from([0xff, 0xd8]), seg(0xdb, [0, ...Array(64).fill(1)]),
    seg(0xc0, [8, claim[1] >> 8, claim[1] & 0xff, claim[0] >> 8, claim[0] & 0xff, 1, 1, 0x11, 0]),
    huff(0), huff(1), seg(0xda, [1, 1, 0, 0, 63, 0]), data, Buffer.from([0xff, 0xd9])]);
}

// The header of an animated WebP (VP8X with the animation flag, then ANIM).
function animatedWebpHeader(width, height) {
  const vp8x = Buffer.alloc(18);
  vp8x.write('VP8X', 0, 'latin1');
  vp8x.writeUInt32LE(10, 4);
  vp8x[8] = 0x02; // animation
  vp8x.writeUIntLE(width - 1, 12, 3);
  vp8x.writeUIntLE(height - 1, 15, 3);
  const anim = Buffer.from([0x41, 0x4e, 0x49, 0x4d, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
  const riff = Buffer.alloc(12);
  riff.write('RIFF', 0, 'latin1');
  riff.writeUInt32LE(4 + vp8x.length + anim.length, 4);
  riff.write('WEBP', 8, 'latin1');
  return Buffer.concat([riff, vp8x, anim]);
}

test('bad images get a 400 naming the image; the server keeps serving', async () => {
  const dir = `${FIXTURES}/qwen2_vl`;
  const server = await startServer(['--model', dir, '--port', '0', '--max-image-pixels', '1000000']);
  try {
    const png = readFileSync(`${dir}/image_84x56.png`);
    // a JPEG whose header says 64x64 and holds no image data
    const lyingJpeg = Buffer.from([0xff, 0xd8, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x40, 0x00, 0x40, 0x03,
      0x01, 0x22, 0x00, 0x02, 0x11, 0x01, 0x03, 0x11, 0x01, 0xff, 0xd9]);
    const random = Buffer.from(Array.from({ length: 300 }, (_, i) => (i * 7919 + 13) % 256));
    const cases = [
      ['truncated PNG', dataUri(png.subarray(0, png.length >> 1)), 'invalid_image'],
      ['JPEG with a lying header', dataUri(lyingJpeg, 'image/jpeg'), 'invalid_image'],
      ['1x100000 aspect ratio', dataUri(pngHeader(100000, 1)), 'invalid_image'],
      ['20000x20000 header on a small file', dataUri(pngHeader(20000, 20000)), 'image_too_large'],
      ['GIF', dataUri(Buffer.from('GIF89a\x01\x00\x01\x00\x00\x00\x00;', 'latin1'), 'image/gif'), 'invalid_image'],
      ['GIF bytes under a PNG type', dataUri(Buffer.from('GIF89a\x01\x00\x01\x00\x00\x00\x00;', 'latin1')), 'invalid_image'],
      ['random bytes', dataUri(random), 'invalid_image'],
      ['a data URI that is not base64', 'data:image/png,hello', 'invalid_image_url'],
      ['broken base64', 'data:image/png;base64,!!!notbase64!!!', 'invalid_image_url'],
      ['a file URL', 'file:///etc/passwd', 'invalid_image_url'],
      ['a URL of a host not allowed', 'http://127.0.0.1:1/x.png', 'image_url_not_allowed'],
      // refused by the frontend from the header
      ['PNG bytes declared image/gif', dataUri(png, 'image/gif'), 'invalid_image', /image\/gif.*PNG/],
      ['an animated WebP', dataUri(animatedWebpHeader(32, 32), 'image/webp'), 'invalid_image', /animated/],
      ['64x48 JPEG claiming 900x900', dataUri(grayJpeg(64, 48, { claim: [900, 900] }), 'image/jpeg'),
        'invalid_image', /900x900/],
      // lies the byte count allows: found by the visual worker, which stops where the data ends
      ['64x48 JPEG claiming 64x96', dataUri(grayJpeg(64, 48, { claim: [64, 96] }), 'image/jpeg'), 'invalid_image', /JPEG/],
      ['half a JPEG', dataUri(grayJpeg(64, 48).subarray(0, -8), 'image/jpeg'), 'invalid_image', /truncated JPEG/],
      ['a JPEG with garbage scan data', dataUri(grayJpeg(64, 48, { scan: Buffer.alloc(12, 0x55) }), 'image/jpeg'),
        'invalid_image', /corrupt/],
    ];
    for (const [what, url, code, message] of cases) {
      const { status, body } = await postJson(`${server.url}/v1/chat/completions`, {
        messages: [{ role: 'user', content: [{ type: 'text', text: 'look:' }, { type: 'image_url', image_url: { url } }] }],
        max_tokens: 2 }, { timeoutMs: 20000 });
      assert.equal(status, 400, `${what}: ${JSON.stringify(body)}`);
      assert.equal(body.error.param, 'messages[0].content[1].image_url', `${what}: ${JSON.stringify(body)}`);
      assert.equal(body.error.code, code, `${what}: ${body.error.message}`);
      if (message) assert.match(body.error.message, message, what);
    }
    const tooMany = await postJson(`${server.url}/v1/chat/completions`, { max_tokens: 2, messages: [{ role: 'user',
      content: Array.from({ length: 9 }, () => ({ type: 'image_url', image_url: { url: dataUri(png) } })) }] });
    assert.equal(tooMany.status, 400);
    assert.equal(tooMany.body.error.code, 'too_many_images');
    // the bytes decide: a matching type, image/jpg for image/jpeg, or no claim
    for (const url of [dataUri(png), dataUri(grayJpeg(64, 48), 'image/jpg'), dataUri(png, 'application/octet-stream')]) {
      const good = await postJson(`${server.url}/v1/chat/completions`, { messages: imageMessage(url), max_tokens: 2 });
      assert.equal(good.status, 200, `${url.slice(0, 40)}: ${JSON.stringify(good.body)}`);
    }
    assert.equal((await getJson(`${server.url}/health`)).status, 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('image limits: at the limit passes, one past gets a 400 naming the image', async () => {
  const dir = `${FIXTURES}/qwen2_vl`;
  const png = readFileSync(`${dir}/image_84x56.png`);
  const ask = (server, urls) => postJson(`${server.url}/v1/chat/completions`, { max_tokens: 2, messages: [{
    role: 'user', content: urls.map((url) => ({ type: 'image_url', image_url: { url } })) }] }, { timeoutMs: 20000 });
  for (const [flags, good, bad, code] of [
    [['--max-image-bytes', String(png.length)], [dataUri(png)], [dataUri(Buffer.concat([png, Buffer.from([0])]))], 'image_too_large'],
    [['--max-image-pixels', String(84 * 56)], [dataUri(png)], [dataUri(pngHeader(85, 56))], 'image_too_large'],
    [['--max-images-per-request', '2'], [dataUri(png), dataUri(png)], [dataUri(png), dataUri(png), dataUri(png)], 'too_many_images'],
  ]) {
    const server = await startServer(['--model', dir, '--port', '0', ...flags]);
    try {
      const ok = await ask(server, good);
      assert.equal(ok.status, 200, `${flags.join(' ')}: at the limit: ${JSON.stringify(ok.body)}`);
      const over = await ask(server, bad);
      assert.equal(over.status, 400, `${flags.join(' ')}: one past: ${JSON.stringify(over.body)}`);
      assert.equal(over.body.error.code, code);
      assert.match(over.body.error.param, /^messages\[0\]\.content\[\d\]\.image_url$/);
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  }
});

test('image URLs: fetched from allowed hosts only, within the limits', async () => {
  const dir = `${FIXTURES}/qwen2_vl`;
  const reference = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
  const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
  const png = readFileSync(`${dir}/image_84x56.png`);
  const media = http.createServer((req, res) => {
    if (req.url === '/cat.png') { res.writeHead(200, { 'content-type': 'image/png' }); res.end(png); return; }
    if (req.url === '/big.png') { res.writeHead(200); res.end(Buffer.alloc(5000)); return; }
    if (req.url === '/moved.png') { res.writeHead(302, { location: 'http://localhost/cat.png' }); res.end(); return; }
    res.writeHead(404); res.end();
  });
  await new Promise((r) => media.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${media.address().port}`;
  const server = await startServer(['--model', dir, '--port', '0', '--allowed-media-domains', '127.0.0.1',
    '--max-image-bytes', '4096']);
  try {
    const ask = (url) => postJson(`${server.url}/v1/chat/completions`,
      { messages: imageMessage(url), max_tokens: 12, temperature: 0 }, { timeoutMs: 20000 });
    const ok = await ask(`${base}/cat.png`);
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    assert.equal(ok.body.choices[0].message.content, decode(reference.cases[2].greedy_continuation));
    for (const [path, code] of [['/missing.png', 'image_fetch_failed'], ['/big.png', 'image_too_large'],
      ['/moved.png', 'image_fetch_failed']]) {
      const r = await ask(`${base}${path}`);
      assert.equal(r.status, 400, `${path}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error.code, code, `${path}: ${r.body.error.message}`);
    }
    const other = await ask(`http://localhost:${media.address().port}/cat.png`);
    assert.equal(other.body.error.code, 'image_url_not_allowed', 'only the listed host');
  } finally {
    media.close();
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('a visual worker killed mid-request: 503 for the image, text keeps working, images come back', async () => {
  const dir = `${FIXTURES}/qwen2_vl`;
  const reference = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
  const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
  const server = await startServer(['--model', dir, '--port', '0', '--restart-backoff-ms', '50']);
  const visual = async () => (await getJson(`${server.url}/health`)).body.processes.find((p) => p.role === 'visual');
  try {
    const { pid } = await visual();
    process.kill(pid, 'SIGSTOP'); // it takes the job and never answers
    const image = readFileSync(`${dir}/${reference.cases[3].image}`);
    const pending = postJson(`${server.url}/v1/chat/completions`,
      { messages: imageMessage(dataUri(image)), max_tokens: 12, temperature: 0 }, { timeoutMs: 20000 });
    const text = await postJson(`${server.url}/v1/chat/completions`,
      { messages: [{ role: 'user', content: 'hello' }], max_tokens: 3 }, { timeoutMs: 20000 });
    assert.equal(text.status, 200, 'text requests do not wait for the visual worker');
    process.kill(pid, 'SIGKILL');
    const failed = await pending;
    assert.equal(failed.status, 503, JSON.stringify(failed.body));
    assert.match(failed.body.error.message, /visual worker/);
    await waitFor('the visual worker back', async () => {
      const v = await visual();
      return v.state === 'ready' && v.pid !== pid;
    });
    const again = await postJson(`${server.url}/v1/chat/completions`,
      { messages: imageMessage(dataUri(image)), max_tokens: 12, temperature: 0 }, { timeoutMs: 20000 });
    assert.equal(again.status, 200, JSON.stringify(again.body));
    assert.equal(again.body.choices[0].message.content, decode(reference.cases[3].greedy_continuation));
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
