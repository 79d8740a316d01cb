// tools.test.mjs - function calling end to end, through the official SDK: a
// scripted model (scripted_model.mjs) whose greedy answer to any chat is
//     Let me check.<tool_call>...get_weather...</tool_call>\n<tool_call>...get_time...</tool_call>
// comes back as content plus two tool calls, whole and streamed (get_weather's arguments in two
// pieces, as two tokens generate them); and, when tool_choice forces a call, the rest of that
// call. The chat prompt ends in "\n", so the answer is the chain "\n" -> pieces -> <|im_end|>.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startServer, stopServer, postJson } from './harness.mjs';
import { writeScriptedModel, chainEdges, vocabId } from './scripted_model.mjs';

const PIECES = [
  'Let me check.',
  '<tool_call>\n{"name": "get_weather", ',
  '"arguments": {"city": "Paris", ',
  '"days": [1, 2]}}\n</tool_call>',
  '\n<tool_call>\n{"na', // (two pieces: max_tokens can cut the second call before its name)
  'me": "get_time", "arguments": {}}\n</tool_call>',
  // the rest of an answer whose start tool_choice forced: a named function, "required"
  '{"city": "Lyon"}}\n</tool_call>',
  'get_time", "arguments": {}}\n</tool_call>',
];
const ANSWER = PIECES.slice(0, 6).join(''); // what the model says to a plain chat
const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  { type: 'function', function: { name: 'get_time' } },
];
const messages = [{ role: 'user', content: 'Weather in Paris, and the time?' }];

const named = { type: 'function', function: { name: 'get_weather' } };
const serve = (dir) => startServer(['--model', dir, '--port', '0', '--served-model-name', 'scripted']);
const lastPromptToken = async (body) => (await postJson(`${server.url}/tokenize`, body)).body.tokens.at(-1);

let dir, server, client;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vlmd-tools-'));
  const newline = vocabId('qwen2', 'Ċ');
  const answer = [newline, ...[0, 1, 2, 3, 4, 5].map((piece) => ({ piece })), 'end'];
  writeScriptedModel(dir, { pieces: PIECES, edges: chainEdges([answer]) });
  server = await serve(dir);
  // a forced call ends the prompt with its start: the answers go on from its last token
  const n = await lastPromptToken({ messages, tools, tool_choice: named });
  const r = await lastPromptToken({ messages, tools, tool_choice: 'required' });
  assert.ok(new Set([newline, n, r]).size === 3, 'three distinct last prompt tokens');
  await stopServer(server);
  writeScriptedModel(dir, { pieces: PIECES, edges: chainEdges([answer, [n, { piece: 6 }, 'end'], [r, { piece: 7 }, 'end']]) });
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

// A streamed answer read through the SDK: content, and each call accumulated from its deltas.
async function streamed(extra) {
  const out = { content: '', calls: [], finish: null, roles: 0 };
  for await (const chunk of await client.chat.completions.create({ model: 'scripted', messages, temperature: 0, stream: true, ...extra })) {
    for (const c of chunk.choices) {
      if (c.delta.role) out.roles++;
      out.content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) {
        if (t.index === out.calls.length) { // a call begins: its id and name come first
          assert.match(t.id, /^call_/);
          assert.equal(t.type, 'function');
          out.calls.push({ name: t.function.name, arguments: '', deltas: 0 });
        } else {
          assert.equal(t.index, out.calls.length - 1, 'the last call goes on');
          assert.equal(t.id, undefined);
          assert.equal(t.function.name, undefined);
        }
        out.calls[t.index].arguments += t.function.arguments ?? '';
        out.calls[t.index].deltas += t.function.arguments ? 1 : 0;
      }
      out.finish = c.finish_reason ?? out.finish;
    }
  }
  return out;
}

test('streamed: the content, then each call, its name first and its arguments in pieces', async () => {
  const s = await streamed({ tools });
  assert.equal(s.content, 'Let me check.');
  assert.equal(s.roles, 1);
  assert.deepEqual(s.calls.map(({ name, arguments: a }) => ({ name, arguments: JSON.parse(a) })), wantCalls);
  assert.equal(s.calls[0].deltas, 2, 'get_weather\'s arguments come as two tokens make them');
  assert.equal(s.finish, 'tool_calls');
  // the same strings as the answer that is not streamed
  const whole = await client.chat.completions.create({ model: 'scripted', messages, tools, temperature: 0 });
  assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]),
    whole.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
  assert.equal(whole.choices[0].message.tool_calls[0].function.arguments, '{"city": "Paris", "days": [1, 2]}',
    'the arguments as the model wrote them');
  // the SDK's own accumulation of the stream agrees
  const final = await client.chat.completions.stream({ model: 'scripted', messages, tools, temperature: 0 }).finalChatCompletion();
  assert.deepEqual(final.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
    whole.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
  assert.equal(final.choices[0].message.content, 'Let me check.');
});

test('max_tokens cuts the second call before its name: the first call, finish "length", streamed or not', async () => {
  const r = await client.chat.completions.create({ model: 'scripted', messages, tools, temperature: 0, max_tokens: 5 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.choices[0].message.content, 'Let me check.');
  assert.deepEqual(r.choices[0].message.tool_calls.map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) })),
    wantCalls.slice(0, 1));
  const s = await streamed({ tools, max_tokens: 5 });
  assert.equal(s.content, 'Let me check.', 'no fragment of the cut call as content');
  assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]), r.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
  assert.equal(s.finish, 'length');
});

test('tool_choice forces a call: a named function, or "required"', async () => {
  const r = await client.chat.completions.create({ model: 'scripted', messages, tools, tool_choice: named, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.content, null);
  assert.deepEqual(r.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    [['get_weather', { city: 'Lyon' }]]);
  const s = await streamed({ tools, tool_choice: 'required' });
  assert.equal(s.content, '', 'no content before the forced call');
  assert.deepEqual(s.calls.map((c) => [c.name, JSON.parse(c.arguments)]), [['get_time', {}]]);
  const n = await streamed({ tools, tool_choice: named });
  assert.deepEqual(n.calls.map((c) => [c.name, JSON.parse(c.arguments)]), [['get_weather', { city: 'Lyon' }]]);
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
