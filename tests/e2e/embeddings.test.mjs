// embeddings.test.mjs - embedding and reranking models through the five
// processes: every case of the qwen3_embedding and qwen3_reranker fixtures
// (request bodies as the fixture gives them, answers against its tensors),
// the refusals its README lists, the four client libraries' embedding calls
// as their users make them, a Cohere/Jina-shaped rerank, the task's 400s,
// and embeddings flooding beside chat on one engine on the simulated device.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { embed, embedMany } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { OpenAIEmbeddings } from '@langchain/openai';
import { OpenAIEmbedding } from '@llamaindex/openai';
import { FIXTURES, SCALE, startServer, stopServer, postJson, getJson, waitFor } from './harness.mjs';

const EMBED = `${FIXTURES}/qwen3_embedding`;
const RERANK = `${FIXTURES}/qwen3_reranker`;
const embedRef = JSON.parse(readFileSync(`${EMBED}/reference.json`, 'utf8'));
const rerankRef = JSON.parse(readFileSync(`${RERANK}/reference.json`, 'utf8'));

// Every F32 tensor of a safetensors file: name -> Float32Array.
function readTensors(path) {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const out = new Map();
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const bytes = buf.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
    out.set(name, new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)));
  }
  return out;
}
const embedTensors = readTensors(`${EMBED}/reference.safetensors`);

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
function relErr(out, ref) {
  assert.equal(out.length, ref.length, 'the vector\'s length');
  let d = 0;
  for (let i = 0; i < ref.length; i++) d += (out[i] - ref[i]) ** 2;
  return Math.sqrt(d) / norm(ref);
}
// base64 of little-endian float32 bytes -> numbers
const fromBase64 = (s) => {
  const b = Buffer.from(s, 'base64');
  return Array.from(new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length)));
};
function assertVector(vec, ref, what, tol = 1e-4) {
  const err = relErr(vec, ref);
  assert.ok(err <= tol, `${what}: relative error ${err}`);
  assert.ok(Math.abs(norm(vec) - 1) <= 1e-5, `${what}: norm ${norm(vec)}`);
}
const reference = (c, k) => embedTensors.get(`case${c}.input${k}.embedding`);

// The router's admissions once its snapshots (one a heartbeat) have caught up
// with every request answered so far: the same count twice, a few heartbeats apart.
async function settledAdmissions(url) {
  const read = async () => (await getJson(`${url}/memory_stats`)).body.router.counters.requests_admitted_total;
  return waitFor('the admissions to settle', async () => {
    const a = await read();
    await new Promise((r) => setTimeout(r, 250 * SCALE));
    return a === await read() && { a };
  }, 20000 * SCALE).then((x) => x.a);
}

let embedServer, rerankServer;
before(async () => {
  [embedServer, rerankServer] = await Promise.all([
    startServer(['--model', EMBED, '--port', '0', '--max-model-len', '128', '--heartbeat-ms', '50']),
    startServer(['--model', RERANK, '--port', '0']),
  ]);
});
after(async () => {
  for (const s of [embedServer, rerankServer])
    if (s) assert.deepEqual(await stopServer(s), { code: 0, signal: null }, s.stderr.slice(-3000));
});

test('every qwen3_embedding case: vectors within 1e-4, base64 the same bytes, usage and shape exact', async () => {
  assert.equal((await getJson(`${embedServer.url}/health`)).body.task, 'embed');
  for (const [c, cs] of embedRef.cases.entries()) {
    const r = await postJson(`${embedServer.url}/v1/embeddings`, cs.request);
    assert.equal(r.status, 200, `case ${c} (${cs.name}): ${JSON.stringify(r.body)}`);
    assert.equal(r.body.object, 'list');
    assert.equal(r.body.model, 'qwen3_embedding');
    assert.deepEqual(r.body.usage, cs.usage, `case ${c}: usage`);
    assert.equal(r.body.data.length, cs.inputs.length);
    r.body.data.forEach((d, k) => {
      assert.equal(d.object, 'embedding');
      assert.equal(d.index, k, 'in input order');
      const base64 = cs.request.encoding_format === 'base64';
      assert.equal(typeof d.embedding, base64 ? 'string' : 'object');
      const vec = base64 ? fromBase64(d.embedding) : d.embedding;
      assertVector(vec, reference(c, k), `case ${c} input ${k} (${cs.name})`);
      if (cs.embedding_base64_of_reference)
        assertVector(vec, fromBase64(cs.embedding_base64_of_reference), `case ${c}: the reference's base64`);
    });
  }
  // every input of a batch equals the input embedded alone; text = its ids as given
  const batch = embedRef.cases[2];
  for (const [k, input] of batch.inputs.entries()) {
    const alone = await postJson(`${embedServer.url}/v1/embeddings`, { input: input.text });
    assertVector(alone.body.data[0].embedding, reference(2, k), `batch input ${k} alone`);
  }
});

test("the tokenizer's post-processor: text gets <|endoftext|>, token ids are as given, add_special_tokens false adds none", async () => {
  const cases = embedRef.tokenizer_cases;
  const texts = await postJson(`${embedServer.url}/v1/embeddings`, { input: cases.map((t) => t.text) });
  const ids = await postJson(`${embedServer.url}/v1/embeddings`, { input: cases.map((t) => t.ids_add_special_tokens) });
  const bare = await postJson(`${embedServer.url}/v1/embeddings`,
    { input: cases.map((t) => t.text), add_special_tokens: false });
  const bareIds = await postJson(`${embedServer.url}/v1/embeddings`,
    { input: cases.map((t) => t.ids_no_special_tokens).filter((x) => x.length) });
  for (const r of [texts, ids]) assert.equal(r.status, 200, JSON.stringify(r.body));
  const count = (key) => cases.reduce((s, t) => s + t[key].length, 0);
  assert.equal(texts.body.usage.prompt_tokens, count('ids_add_special_tokens'));
  assert.equal(ids.body.usage.prompt_tokens, count('ids_add_special_tokens'));
  cases.forEach((t, i) => assert.ok(relErr(texts.body.data[i].embedding, ids.body.data[i].embedding) < 1e-6,
    `"${t.text}": the text's vector is its ids'`));
  if (cases.every((t) => t.ids_no_special_tokens.length)) {
    assert.equal(bare.status, 200, JSON.stringify(bare.body));
    assert.equal(bare.body.usage.prompt_tokens, count('ids_no_special_tokens'));
    cases.forEach((t, i) => assert.ok(relErr(bare.body.data[i].embedding, bareIds.body.data[i].embedding) < 1e-6));
  } else {
    assert.equal(bare.status, 400, 'an empty text without its EOS has no token');
  }
});

test('truncate_prompt_tokens keeps the last tokens; without it a long input is refused with the length', async () => {
  const long = Array.from({ length: 150 }, (_, i) => (i * 7) % 1000);
  const refused = await postJson(`${embedServer.url}/v1/embeddings`, { input: [long] });
  assert.equal(refused.status, 400);
  assert.equal(refused.body.error.param, 'input');
  assert.match(refused.body.error.message, /150 tokens.*128/);
  const cut = await postJson(`${embedServer.url}/v1/embeddings`, { input: [long], truncate_prompt_tokens: 20 });
  const tail = await postJson(`${embedServer.url}/v1/embeddings`, { input: [long.slice(-20)] });
  assert.equal(cut.status, 200, JSON.stringify(cut.body));
  assert.equal(cut.body.usage.prompt_tokens, 20);
  assert.ok(relErr(cut.body.data[0].embedding, tail.body.data[0].embedding) < 1e-6);
  const whole = await postJson(`${embedServer.url}/v1/embeddings`, { input: [long], truncate_prompt_tokens: -1 });
  assert.equal(whole.body.usage.prompt_tokens, 128, '-1: the model\'s length');
});

test('embeddings refusals: each a 400 naming its field, none reaches the engine', async () => {
  const V = embedRef.vocab_size;
  const cases = [
    [{}, 'input'], [{ input: null }, 'input'], [{ input: [] }, 'input'], [{ input: [[]] }, 'input'],
    [{ input: ['a', 1] }, 'input'], [{ input: [1, 'a'] }, 'input'], [{ input: [[1], 'a'] }, 'input'],
    [{ input: [[1, -1]] }, 'input'], [{ input: [V] }, 'input'], [{ input: [1.5] }, 'input'],
    [{ input: { text: 'a' } }, 'input'], [{ input: 'a', encoding_format: 'int8' }, 'encoding_format'],
    [{ input: 'a', dimensions: 0 }, 'dimensions'], [{ input: 'a', dimensions: embedRef.hidden_size + 1 }, 'dimensions'],
    [{ input: 'a', dimensions: '32' }, 'dimensions'], [{ input: 'a', truncate_prompt_tokens: 0 }, 'truncate_prompt_tokens'],
    [{ input: 'a', add_special_tokens: 'yes' }, 'add_special_tokens'], [{ input: 'a', user: 5 }, 'user'],
  ];
  const before = await settledAdmissions(embedServer.url);
  for (const [body, param] of cases) {
    const r = await postJson(`${embedServer.url}/v1/embeddings`, body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error.type, 'invalid_request_error');
    assert.equal(r.body.error.param, param, JSON.stringify(body));
  }
  const unknown = await postJson(`${embedServer.url}/v1/embeddings`, { model: 'gpt-x', input: 'a' });
  assert.equal(unknown.status, 404);
  assert.equal(await settledAdmissions(embedServer.url), before, 'no refused request was admitted');
  // the other tasks' endpoints name this one's
  for (const path of ['/v1/chat/completions', '/v1/completions', '/v1/rerank', '/v1/score', '/v1/responses']) {
    const r = await postJson(`${embedServer.url}${path}`, { messages: [{ role: 'user', content: 'hi' }], prompt: 'hi', input: 'hi', query: 'a', documents: ['b'] });
    assert.equal(r.status, 400, path);
    assert.equal(r.body.error.code, 'unsupported_task', path);
    assert.match(r.body.error.message, /serves the task 'embed' \(\/v1\/embeddings\)/);
  }
});

test('the four client libraries embed as their users call them', async () => {
  const baseURL = `${embedServer.url}/v1`;
  const hello = embedRef.cases[0], batch = embedRef.cases[2];
  const texts = batch.inputs.map((i) => i.text);
  // the official SDK: base64 by default (decoded for the caller), then floats, then dimensions
  const sdk = new OpenAI({ baseURL, apiKey: 'x', maxRetries: 0 });
  const one = await sdk.embeddings.create({ model: 'qwen3_embedding', input: hello.request.input });
  assertVector(one.data[0].embedding, reference(0, 0), 'openai SDK, default (base64 on the wire)');
  assert.deepEqual(one.usage, hello.usage);
  const many = await sdk.embeddings.create({ model: 'qwen3_embedding', input: texts, encoding_format: 'float' });
  many.data.forEach((d, k) => assertVector(d.embedding, reference(2, k), `openai SDK, batch ${k}`));
  const short = await sdk.embeddings.create({ model: 'qwen3_embedding', ...embedRef.cases[10].request });
  assertVector(short.data[0].embedding, reference(10, 0), 'openai SDK, dimensions 64');
  // LangChain's OpenAIEmbeddings
  const lc = new OpenAIEmbeddings({ model: 'qwen3_embedding', apiKey: 'x', configuration: { baseURL }, maxRetries: 0 });
  assertVector(await lc.embedQuery(hello.request.input), reference(0, 0), 'LangChain embedQuery');
  (await lc.embedDocuments(texts)).forEach((v, k) => assertVector(v, reference(2, k), `LangChain embedDocuments ${k}`));
  // the AI SDK: embed, embedMany (data read in array order)
  const provider = createOpenAICompatible({ baseURL, name: 'vlmd' });
  const model = provider.textEmbeddingModel('qwen3_embedding');
  const e1 = await embed({ model, value: hello.request.input, maxRetries: 0 });
  assertVector(e1.embedding, reference(0, 0), 'AI SDK embed');
  const em = await embedMany({ model, values: texts, maxRetries: 0 });
  em.embeddings.forEach((v, k) => assertVector(v, reference(2, k), `AI SDK embedMany ${k}`));
  // LlamaIndex's OpenAIEmbedding (it sends a list, newlines replaced)
  const li = new OpenAIEmbedding({ model: 'qwen3_embedding', apiKey: 'x', baseURL, maxRetries: 0 });
  assertVector(await li.getTextEmbedding(hello.request.input), reference(0, 0), 'LlamaIndex getTextEmbedding');
  (await li.getTextEmbeddings(texts)).forEach((v, k) => assertVector(v, reference(2, k), `LlamaIndex batch ${k}`));
});

test('every qwen3_reranker case: /v1/rerank, /rerank and /v2/rerank in order with top_n; /v1/score 1:N and N:N', async () => {
  assert.equal((await getJson(`${rerankServer.url}/health`)).body.task, 'rerank');
  for (const rc of rerankRef.rerank_cases) {
    for (const path of ['/v1/rerank', '/rerank', '/v2/rerank']) {
      const r = await postJson(`${rerankServer.url}${path}`, rc.request);
      assert.equal(r.status, 200, `${path}: ${JSON.stringify(r.body)}`);
      assert.deepEqual(r.body.usage, rc.usage);
      assert.equal(r.body.model, 'qwen3_reranker');
      assert.deepEqual(r.body.results.map((x) => x.index), rc.expected_results.map((x) => x.index), 'the order');
      r.body.results.forEach((x, k) => {
        assert.ok(Math.abs(x.relevance_score - rc.expected_results[k].relevance_score) <= 1e-5,
          `${path} result ${k}: ${x.relevance_score} vs ${rc.expected_results[k].relevance_score}`);
        assert.deepEqual(x.document, rc.expected_results[k].document);
      });
    }
    // Cohere's shape: {text} objects, no documents back
    const cohere = await postJson(`${rerankServer.url}/v2/rerank`, {
      ...rc.request, documents: rc.request.documents.map((text) => ({ text })), return_documents: false });
    assert.equal(cohere.status, 200, JSON.stringify(cohere.body));
    assert.deepEqual(cohere.body.results.map((x) => x.index), rc.expected_results.map((x) => x.index));
    assert.ok(cohere.body.results.every((x) => !('document' in x)), 'return_documents false');
  }
  for (const sc of rerankRef.score_cases) {
    const r = await postJson(`${rerankServer.url}/v1/score`, sc.request);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.object, 'list');
    assert.equal(r.body.data.length, sc.expected_data.length);
    r.body.data.forEach((d, k) => {
      assert.equal(d.index, sc.expected_data[k].index, 'in pair order');
      assert.equal(d.object, 'score');
      assert.ok(Math.abs(d.score - sc.expected_data[k].score) <= 1e-5, `score ${k}: ${d.score}`);
    });
    const total = sc.pair_indices.reduce((s, j) => s + rerankRef.pairs[j].n_tokens, 0);
    assert.equal(r.body.usage.prompt_tokens, total, 'usage: the rendered prompts');
  }
});

test('rerank and score refusals: each a 400 naming its field', async () => {
  const cases = [
    ['/v1/rerank', { documents: ['a'] }, 'query'], ['/v1/rerank', { query: 1, documents: ['a'] }, 'query'],
    ['/v1/rerank', { query: 'q' }, 'documents'], ['/v1/rerank', { query: 'q', documents: [] }, 'documents'],
    ['/v1/rerank', { query: 'q', documents: 'a' }, 'documents'], ['/v1/rerank', { query: 'q', documents: ['a', 5] }, 'documents'],
    ['/v1/rerank', { query: 'q', documents: [{ txt: 'a' }] }, 'documents'], ['/v1/rerank', { query: 'q', documents: ['a'], top_n: -1 }, 'top_n'],
    ['/v1/rerank', { query: 'q', documents: ['a'], return_documents: 1 }, 'return_documents'],
    ['/v1/rerank', { query: 'q', documents: ['a'], instruction: 3 }, 'instruction'],
    ['/v1/score', { text_2: ['a'] }, 'text_1'], ['/v1/score', { text_1: 'q' }, 'text_2'],
    ['/v1/score', { text_1: ['a', 'b'], text_2: ['c', 'd', 'e'] }, 'text_2'], ['/v1/score', { text_1: 'q', text_2: [1] }, 'text_2'],
    ['/v1/score', { text_1: [], text_2: ['a'] }, 'text_1'],
  ];
  for (const [path, body, param] of cases) {
    const r = await postJson(`${rerankServer.url}${path}`, body);
    assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error.param, param, `${path} ${JSON.stringify(body)}`);
  }
  const e = await postJson(`${rerankServer.url}/v1/embeddings`, { input: 'a' });
  assert.equal(e.status, 400);
  assert.match(e.body.error.message, /serves the task 'rerank'/);
  // an instruction of the request's own is used as the card writes it
  const pair = rerankRef.pairs.find((p) => p.instruction);
  const custom = await postJson(`${rerankServer.url}/v1/score`, { text_1: pair.query, text_2: pair.document, instruction: pair.instruction });
  assert.ok(Math.abs(custom.body.data[0].score - pair.score) <= 1e-5);
  assert.equal(custom.body.usage.prompt_tokens, pair.n_tokens);
});

test('embeddings flood beside chat on one engine (--task generate+embed, the simulated device): nothing fails, nothing is allocated after ready', async () => {
  const server = await startServer(['--model', `${FIXTURES}/qwen2`, '--port', '0', '--task', 'generate+embed',
    '--device', 'cpu', '--cpu-device-mb', '320', '--max-total-token-num', '1024', '--max-model-len', '512',
    '--heartbeat-ms', '50']);
  try {
    assert.equal((await getJson(`${server.url}/health`)).body.task, 'generate+embed');
    const texts = Array.from({ length: 24 }, (_, i) => `document ${i}: ${'words and more words '.repeat(1 + (i % 9))}`);
    const alone = await postJson(`${server.url}/v1/embeddings`, { input: texts });
    assert.equal(alone.status, 200, JSON.stringify(alone.body));
    const chat = (i) => postJson(`${server.url}/v1/chat/completions`,
      { messages: [{ role: 'user', content: `question ${i}` }], max_tokens: 24, temperature: 0 }, { timeoutMs: 120000 });
    const embeds = (i) => postJson(`${server.url}/v1/embeddings`, { input: texts.slice(i % 12, (i % 12) + 12) }, { timeoutMs: 120000 });
    const results = await Promise.all(Array.from({ length: 48 }, (_, i) => (i % 3 === 0 ? chat(i) : embeds(i))));
    results.forEach((r, i) => {
      assert.equal(r.status, 200, `request ${i}: ${JSON.stringify(r.body)}`);
      if (i % 3 !== 0)
        r.body.data.forEach((d, k) => assert.ok(relErr(d.embedding, alone.body.data[(i % 12) + k].embedding) < 1e-5,
          `request ${i} input ${k}: the same vector as alone, batched beside the others`));
    });
    const stats = await waitFor('the last counters', async () => {
      const m = (await getJson(`${server.url}/memory_stats`)).body;
      return m.router.counters.requests_admitted_total === 24 + 16 + 32 * 12 && m;
    }, 10000);
    assert.equal(stats.llm.counters.device_allocations_since_ready, 0, 'no device allocation after ready');
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(metrics, /vlmd_pooling_requests_total\{model="qwen2"\} 33/);
    assert.match(metrics, /vlmd_requests_finished_total\{model="qwen2",finished_reason="error"\} 0/);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
