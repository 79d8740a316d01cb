// tools.test.mjs - function calling end to end, through the official SDK: a
// scripted model (written here) whose greedy answer to any chat is
//     Let me check.<tool_call>...get_weather...</tool_call>\n<tool_call>...get_time...</tool_call>
// comes back as content plus two tool calls, whole and streamed; and, when
// tool_choice forces a call, the rest of that call.
//
// The model: the fixture tokenizer with four added tokens (the answer's
// pieces), and one layer whose attention and MLP are zero, so the logits of
// the last token depend on that token alone: its embedding is a one-hot slot
// and lm_head maps each slot to the next piece (80 against 0). The chat
// prompt ends in "\n", so the answer is the chain "\n" -> A -> B -> C -> D -> <|im_end|>.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync, copyFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { FIXTURES, startServer, stopServer, postJson } from './harness.mjs';

const PIECES = [
  'Let me check.',
  '<tool_call>\n{"name": "get_weather", ',
  '"arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>',
  '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
  // the rest of an answer whose start tool_choice forced: a named function, "required"
  '{"city": "Lyon"}}\n</tool_call>',
  'get_time", "arguments": {}}\n</tool_call>',
];
const ANSWER = PIECES.slice(0, 4).join(''); // what the model says to a plain chat
const H = 64, V = 1040;
const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  { type: 'function', function: { name: 'get_time' } },
];
const messages = [{ role: 'user', content: 'Weather in Paris, and the time?' }];

// A safetensors file of F32 tensors ({name: [shape, Float32Array]}).
function safetensors(tensors) {
  const header = {};
  let offset = 0;
  for (const [name, [shape, data]] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([head, Buffer.from(json), ...Object.values(tensors).map(([, d]) => Buffer.from(d.buffer))]);
}

// chains: lists of token ids (or piece indexes as {piece: i}), each token followed by the next.
function writeScriptedModel(dir, chains) {
  const src = `${FIXTURES}/qwen2`;
  const tokenizer = JSON.parse(readFileSync(`${src}/tokenizer.json`, 'utf8'));
  const firstNew = Math.max(...tokenizer.added_tokens.map((t) => t.id)) + 1;
  PIECES.forEach((content, i) => tokenizer.added_tokens.push({ id: firstNew + i, content, single_word: false,
    lstrip: false, rstrip: false, normalized: false, special: false }));
  writeFileSync(`${dir}/tokenizer.json`, JSON.stringify(tokenizer));
  copyFileSync(`${src}/tokenizer_config.json`, `${dir}/tokenizer_config.json`);
  const config = JSON.parse(readFileSync(`${src}/config.json`, 'utf8'));
  Object.assign(config, { hidden_size: H, intermediate_size: H, num_hidden_layers: 1, layer_types: ['full_attention'],
    num_attention_heads: 1, num_key_value_heads: 1, vocab_size: V, tie_word_embeddings: false });
  writeFileSync(`${dir}/config.json`, JSON.stringify(config));
  const imEnd = tokenizer.added_tokens.find((t) => t.content === '<|im_end|>').id;
  const id = (t) => (t === 'end' ? imEnd : typeof t === 'object' ? firstNew + t.piece : t);
  const embed = new Float32Array(V * H), lmHead = new Float32Array(V * H);
  let slot = 0;
  for (const chain of chains)
    for (let k = 0; k + 1 < chain.length; k++, slot++) {
      embed[id(chain[k]) * H + slot] = 1;        // the token lights its slot
      lmHead[id(chain[k + 1]) * H + slot] = 10;  // the slot votes for the next token
    }
  const zeros = (...shape) => [shape, new Float32Array(shape.reduce((a, b) => a * b))];
  const ones = (n) => [[n], new Float32Array(n).fill(1)];
  const p = 'model.layers.0.';
  writeFileSync(`${dir}/model.safetensors`, safetensors({
    'lm_head.weight': [[V, H], lmHead], 'model.embed_tokens.weight': [[V, H], embed],
    [`${p}input_layernorm.weight`]: ones(H), [`${p}mlp.down_proj.weight`]: zeros(H, H),
    [`${p}mlp.gate_proj.weight`]: zeros(H, H), [`${p}mlp.up_proj.weight`]: zeros(H, H),
    [`${p}post_attention_layernorm.weight`]: ones(H),
    [`${p}self_attn.k_proj.bias`]: zeros(H), [`${p}self_attn.k_proj.weight`]: zeros(H, H),
    [`${p}self_attn.o_proj.weight`]: zeros(H, H),
    [`${p}self_attn.q_proj.bias`]: zeros(H), [`${p}self_attn.q_proj.weight`]: zeros(H, H),
    [`${p}self_attn.v_proj.bias`]: zeros(H), [`${p}self_attn.v_proj.weight`]: zeros(H, H),
    'model.norm.weight': ones(H),
  }));
}

const named = { type: 'function', function: { name: 'get_weather' } };
const serve = (dir) => startServer(['--model', dir, '--port', '0', '--served-model-name', 'scripted']);
const lastPromptToken = async (body) => (await postJson(`${server.url}/tokenize`, body)).body.tokens.at(-1);

let dir, server, client;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vlmd-tools-'));
  const newline = JSON.parse(readFileSync(`${FIXTURES}/qwen2/tokenizer.json`, 'utf8')).model.vocab['Ċ'];
  const answer = [newline, { piece: 0 }, { piece: 1 }, { piece: 2 }, { piece: 3 }, 'end'];
  writeScriptedModel(dir, [answer]);
  server = await serve(dir);
  // a forced call ends the prompt with its start: the answers go on from its last token
  const n = await lastPromptToken({ messages, tools, tool_choice: named });
  const r = await lastPromptToken({ messages, tools, tool_choice: 'required' });
  assert.ok(new Set([newline, n, r]).size === 3, 'three distinct last prompt tokens');
  await stopServer(server);
  writeScriptedModel(dir, [answer, [n, { piece: 4 }, 'end'], [r, { piece: 5 }, 'end']]);
  server = await serve(dir);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  rmSync(dir, { recursive: true, force: true });
});

const wantCalls = [
  { name: 'get_weather', arguments: { city: 'Paris', days: [1, 2] } },
  { name: 'get_time', arguments: {} },
];

test('without tools the scripted answer is plain text', async () => {
  const r = await client.chat.completions.create({ model: 'scripted', messages, temperature: 0 });
  assert.equal(r.choices[0].message.content, ANSWER);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.tool_calls, undefined);
});

test('with tools the answer is content and two calls', async () => {
  const r = await client.chat.completions.create({ model: 'scripted', messages, tools, temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, 'Let me check.');
  assert.deepEqual(m.tool_calls.map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) })), wantCalls);
  for (const c of m.tool_calls) {
    assert.equal(c.type, 'function');
    assert.match(c.id, /^call_/);
  }
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
  // tool_choice "none": the tools are not offered, and the text is not read for calls
  const none = await client.chat.completions.create({ model: 'scripted', messages, tools, tool_choice: 'none', temperature: 0 });
  assert.equal(none.choices[0].message.content, ANSWER);
});

test('streamed: the content, then each call once its block has closed', async () => {
  const stream = await client.chat.completions.create({ model: 'scripted', messages, tools, temperature: 0, stream: true });
  let content = '', finish = null, roles = 0;
  const calls = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta.role) roles++;
      content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) {
        assert.equal(t.index, calls.length, 'calls arrive in order, whole');
        calls.push({ name: t.function.name, arguments: JSON.parse(t.function.arguments), id: t.id });
      }
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(content, 'Let me check.');
  assert.equal(roles, 1);
  assert.deepEqual(calls.map(({ name, arguments: a }) => ({ name, arguments: a })), wantCalls);
  assert.equal(finish, 'tool_calls');
  // the SDK's own accumulation of the stream agrees
  const final = await client.chat.completions.stream({ model: 'scripted', messages, tools, temperature: 0 }).finalChatCompletion();
  assert.deepEqual(final.choices[0].message.tool_calls.map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) })),
    wantCalls);
  assert.equal(final.choices[0].message.content, 'Let me check.');
});

test('tool_choice forces a call: a named function, or "required"', async () => {
  const r = await client.chat.completions.create({ model: 'scripted', messages, tools, tool_choice: named, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.content, null);
  assert.deepEqual(r.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    [['get_weather', { city: 'Lyon' }]]);
  const calls = [];
  for await (const chunk of await client.chat.completions.create({ model: 'scripted', messages, tools, tool_choice: 'required',
    temperature: 0, stream: true }))
    for (const c of chunk.choices) {
      assert.equal(c.delta.content ?? '', '', 'no content before the forced call');
      for (const t of c.delta.tool_calls ?? []) calls.push([t.function.name, JSON.parse(t.function.arguments)]);
    }
  assert.deepEqual(calls, [['get_time', {}]]);
  const bad = await postJson(`${server.url}/v1/chat/completions`, { messages, tools,
    tool_choice: { type: 'function', function: { name: 'nope' } } });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.error.param, 'tool_choice');
});

test('a conversation that carries the calls and their results back in', async () => {
  const first = await client.chat.completions.create({ model: 'scripted', messages, tools, temperature: 0 });
  const calls = first.choices[0].message.tool_calls;
  const next = [...messages, first.choices[0].message,
    { role: 'tool', tool_call_id: calls[0].id, content: '18 C' }, { role: 'tool', tool_call_id: calls[1].id, content: '12:00' }];
  const r = await client.chat.completions.create({ model: 'scripted', messages: next, tools, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls', 'the scripted model calls again');
  const t = await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ messages: next, tools }),
    headers: { 'content-type': 'application/json' } }).then((x) => x.json());
  const text = await fetch(`${server.url}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: t.tokens }),
    headers: { 'content-type': 'application/json' } }).then((x) => x.json());
  assert.ok(text.prompt.includes('<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n'),
    text.prompt);
  assert.ok(text.prompt.includes('<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n'));
});
