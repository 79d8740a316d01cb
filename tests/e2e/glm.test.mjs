// glm.test.mjs - GLM-4.5's chat template, reasoning and tool calls over HTTP, through the
// official SDK.
//
// /tokenize: each glm4_moe fixture chat (as a client sends it: a call's arguments a JSON string)
// gives the fixture's input_ids, asked of a frontend alone (it tokenizes without an engine).
//
// The answer: a scripted model (scripted_model.mjs: the last token alone decides the next)
// with GLM's tokenizer and chat template on a Qwen2 body, whose greedy answer to a chat is
//     \n<think>I should look it up.</think>\nLet me check.\n<tool_call>get_weather\n
//     <arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n
//     <arg_value>2</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call><|observation|>
// where <think>, </think>, <tool_call>, <arg_key>, ... are GLM's special tokens (the frontend
// keeps them in the text it reads) and the answer ends at <|observation|>, one of the three end
// tokens config.json lists: not the engine's own end-of-sequence (the first), so the answer ends
// only because the frontend sends the model's end tokens. It comes back as reasoning_content,
// content and two calls whose arguments are typed by the tools' schemas, whole and streamed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { BIN, FIXTURES, SCALE, startServer, stopServer, postJson, waitFor } from './harness.mjs';
import { writeScriptedModel, vocabId } from './scripted_model.mjs';

const REF = JSON.parse(readFileSync(`${FIXTURES}/glm4_moe/reference.json`, 'utf8'));
const S = REF.special_ids;
const PIECES = [
  '\n<think>', 'I should look it up.', '\nLet me check.\n', 'get_weather\n', 'city', 'Paris',
  '\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n', '\n<tool_call>get_time\n</tool_call>',
];
const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
    properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time' } },
];
const wantCalls = [['get_weather', { city: 'Paris', days: 2 }], ['get_time', {}]];
const messages = [{ role: 'user', content: 'Weather in Paris for 2 days, and the time?' }];
const off = { chat_template_kwargs: { enable_thinking: false } };

// ---- a frontend alone -------------------------------------------------------------------

async function startFrontend(model, dir) {
  const child = spawn(`${BIN}/vlmd-frontend`, ['--model', model, '--port', '0',
    '--router-endpoint', `ipc://${dir}/no-router.sock`], { stdio: ['ignore', 'ignore', 'pipe'] });
  const fe = { child, stderr: '', exited: null };
  child.stderr.on('data', (d) => { fe.stderr += d; });
  child.on('exit', (code, signal) => { fe.exited = { code, signal }; });
  fe.url = await waitFor('the frontend to listen', () => {
    if (fe.exited) throw new Error(`vlmd-frontend exited: ${fe.stderr}`);
    return fe.stderr.match(/listening on (http:\/\/\S+)/)?.[1];
  });
  return fe;
}

test('/tokenize gives each GLM fixture chat its input_ids', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-glmtok-'));
  const fe = await startFrontend(`${FIXTURES}/glm4_moe`, dir);
  try {
    assert.match(fe.stderr, /chat template: glm4_5 /);
    for (const [i, c] of REF.cases.entries()) {
      const sent = c.messages.map((m) => ({ ...m,
        ...(m.role === 'tool' ? { tool_call_id: 'call_0' } : {}),
        ...(m.tool_calls ? { tool_calls: m.tool_calls.map((t) => ({ ...t, id: 'call_0',
          function: { ...t.function, arguments: JSON.stringify(t.function.arguments) } })) } : {}) }));
      const r = await postJson(`${fe.url}/tokenize`, { messages: sent, ...(c.tools ? { tools: c.tools } : {}),
        ...(c.template_kwargs ? { chat_template_kwargs: c.template_kwargs } : {}) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.deepEqual(r.body.tokens, c.input_ids, `case ${i}`);
    }
  } finally {
    fe.child.kill('SIGTERM');
    await waitFor('the frontend to exit', () => fe.exited);
    rmSync(dir, { recursive: true, force: true });
  }
  assert.deepEqual(fe.exited, { code: 0, signal: null }, fe.stderr.slice(-2000));
});

// ---- the scripted GLM model ---------------------------------------------------------------

let dir, server, client;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vlmd-glm-'));
  const newline = vocabId('glm4_moe', 'Ċ');
  const p = (piece) => ({ piece });
  // each token once: the last token alone decides the next
  const chain = [S['<|assistant|>'], p(0), p(1), S['</think>'], p(2), S['<tool_call>'], p(3),
    S['<arg_key>'], p(4), S['</arg_key>'], newline, S['<arg_value>'], p(5), S['</arg_value>'], p(6),
    S['</tool_call>'], p(7), 'end'];
  writeScriptedModel(dir, { tokenizer: 'glm4_moe', pieces: PIECES, vocab: 800, end: '<|observation|>',
    config: { eos_token_id: [S['<|endoftext|>'], S['<|user|>'], S['<|observation|>']] },
    edges: chain.slice(0, -1).map((t, k) => [t, chain[k + 1], 10]) });
  server = await startServer(['--model', dir, '--port', '0', '--served-model-name', 'glm']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  rmSync(dir, { recursive: true, force: true });
});

const ask = (extra = {}) => client.chat.completions.create({ model: 'glm', messages, tools, temperature: 0, ...extra });
const callsOf = (m) => m.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]);

// A stream read through the SDK: each delta kind accumulated; a call's name first, then its
// arguments in pieces (counted).
async function streamed(extra = {}) {
  const out = { reasoning: '', content: '', calls: [], pieces: [], finish: null };
  for await (const chunk of await ask({ ...extra, stream: true })) {
    for (const c of chunk.choices) {
      out.finish = c.finish_reason ?? out.finish;
      out.reasoning += c.delta.reasoning_content ?? '';
      out.content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) {
        if (t.index === out.calls.length) {
          assert.ok(t.function.name, 'a call begins with its name');
          out.calls.push([t.function.name, '']);
          out.pieces.push(0);
        } else {
          assert.equal(t.function.name, undefined);
        }
        out.calls[t.index][1] += t.function.arguments ?? '';
        out.pieces[t.index] += t.function.arguments ? 1 : 0;
      }
    }
  }
  return out;
}

test('the answer: reasoning, content and two calls typed by their schemas, ended by <|observation|>', async () => {
  const r = await ask();
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls', 'stopped at an end token of the model\'s');
  assert.equal(m.reasoning_content, 'I should look it up.');
  assert.equal(m.content, '\nLet me check.\n', 'the text between </think> and the first call');
  assert.deepEqual(callsOf(m), wantCalls);
  assert.equal(m.tool_calls[0].function.arguments, '{"city": "Paris", "days": 2}');
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
  assert.equal(r.usage.completion_tokens, 17, 'every token of the script, <|observation|> included');
});

test('streamed: reasoning, then content, then each call, its name first and its arguments in pieces', async () => {
  const s = await streamed();
  const whole = (await ask()).choices[0].message;
  assert.equal(s.reasoning, whole.reasoning_content);
  assert.equal(s.content, whole.content);
  assert.deepEqual(s.calls, whole.tool_calls.map((c) => [c.function.name, c.function.arguments]));
  assert.ok(s.pieces[0] >= 3, `get_weather's arguments as its pairs come (${s.pieces[0]} pieces)`);
  assert.equal(s.finish, 'tool_calls');
  const final = await client.chat.completions.stream({ model: 'glm', messages, tools, temperature: 0 })
    .finalChatCompletion();
  assert.deepEqual(callsOf(final.choices[0].message), wantCalls);
});

test('thinking off: /nothink and a closed think block in the prompt, the answer all content and calls', async () => {
  const r = await ask(off);
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, undefined);
  assert.equal(m.content, '\nLet me check.\n');
  assert.deepEqual(callsOf(m), wantCalls);
  const t = await postJson(`${server.url}/tokenize`, { messages, tools, ...off });
  const text = await postJson(`${server.url}/detokenize`, { tokens: t.body.tokens });
  assert.ok(text.body.prompt.endsWith('/nothink<|assistant|>\n<think></think>'), text.body.prompt);
});

test('without tools the call text is content, its markers kept', async () => {
  const r = await client.chat.completions.create({ model: 'glm', messages, temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(m.tool_calls, undefined);
  assert.equal(m.content, '\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris'
    + '</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>');
});

test('tool_choice "required": the grammar holds GLM\'s calls, the answer starts with one', async () => {
  const r = await ask({ tool_choice: 'required' });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.content, null);
  assert.equal(r.choices[0].message.reasoning_content, undefined, 'a forced call closes the think block');
  assert.deepEqual(callsOf(r.choices[0].message), wantCalls);
  const s = await streamed({ tool_choice: 'required' });
  assert.deepEqual(s.calls.map(([n, a]) => [n, JSON.parse(a)]), wantCalls);
  const t = await postJson(`${server.url}/tokenize`, { messages, tools, tool_choice: 'required' });
  const text = await postJson(`${server.url}/detokenize`, { tokens: t.body.tokens });
  assert.ok(text.body.prompt.endsWith('<|assistant|>\n<think></think>\n<tool_call>'), text.body.prompt);
});

test('a conversation that carries the calls and their results back in, through <|observation|>', async () => {
  const first = await ask();
  const calls = first.choices[0].message.tool_calls;
  const next = [...messages, first.choices[0].message,
    { role: 'tool', tool_call_id: calls[0].id, content: '18 C' },
    { role: 'tool', tool_call_id: calls[1].id, content: '12:00' }];
  const r = await ask({ messages: next });
  assert.equal(r.choices[0].finish_reason, 'tool_calls', 'the scripted model calls again');
  const t = await postJson(`${server.url}/tokenize`, { messages: next, tools });
  const text = (await postJson(`${server.url}/detokenize`, { tokens: t.body.tokens })).body.prompt;
  assert.ok(text.includes('<|assistant|>\n<think>I should look it up.</think>\nLet me check.\n<tool_call>get_weather\n'
    + '<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n'
    + '</tool_call>\n<tool_call>get_time\n</tool_call><|observation|>\n<tool_response>\n18 C\n</tool_response>\n'
    + '<tool_response>\n12:00\n</tool_response><|assistant|>'), text);
});

test('the Responses API: a reasoning item, the message, and a function_call per call', async () => {
  const r = await client.responses.create({ model: 'glm', input: messages[0].content, store: false,
    tools: tools.map((t) => ({ type: 'function', name: t.function.name, parameters: t.function.parameters ?? null,
      strict: false })) });
  const kinds = r.output.map((o) => o.type);
  assert.deepEqual(kinds, ['reasoning', 'message', 'function_call', 'function_call']);
  assert.equal(r.output[0].content[0].text, 'I should look it up.');
  assert.deepEqual(r.output.slice(2).map((o) => [o.name, JSON.parse(o.arguments)]), wantCalls);
});

// ---- the fixture model itself ---------------------------------------------------------------

test('the GLM-4.5 fixture model served: each case\'s greedy continuation', async () => {
  const s = await startServer(['--model', `${FIXTURES}/glm4_moe`, '--port', '0', '--device', 'cpu']);
  try {
    for (const [i, c] of REF.cases.entries()) {
      const r = await postJson(`${s.url}/v1/completions`, { prompt: c.input_ids, max_tokens: 12,
        temperature: 0, ignore_eos: true }, { timeoutMs: 60000 * SCALE });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.usage.completion_tokens, 12);
      assert.equal(r.body.choices[0].text, c.greedy_continuation_decoded, `case ${i}: the continuation`);
    }
  } finally {
    assert.deepEqual(await stopServer(s), { code: 0, signal: null }, s.stderr.slice(-3000));
  }
});
