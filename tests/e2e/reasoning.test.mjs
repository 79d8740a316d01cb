// reasoning.test.mjs - Qwen3's chat template and a thinking model's answer over HTTP.
//
// /tokenize: each qwen3, qwen3_moe and qwen3_vl fixture chat (images included, as data: URIs)
// gives the fixture's input_ids, asked of a frontend alone (it tokenizes without an engine),
// with thinking off as the fixtures were rendered, and on.
//
// The answer: a scripted model (scripted_model.mjs: the last token alone decides the next)
// with Qwen3's tokenizer and chat template on a Qwen2 body, whose greedy answer to a
// chat is
//     <think>\nI need the weather.\n</think>\n\nLet me check.<tool_call>...</tool_call>
// It comes back as reasoning_content and content (and a call, with tools), whole and streamed
// through the official SDK. With logit_bias banning <think>, the model says
//     Thinking already.\n</think>\n\nLet me check.<tool_call>...</tool_call>
// as a model whose prompt opened the think block does; with enable_thinking false the prompt
// ends with an empty think block, after which it says "Plain answer.".
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { BIN, FIXTURES, startServer, stopServer, postJson, waitFor } from './harness.mjs';
import { writeScriptedModel } from './scripted_model.mjs';

const CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const PIECES = ['\nI need the weather.\n', '\n\nLet me check.', CALL, 'Thinking already.\n', 'Plain answer.'];
const [REASONING, CONTENT, , REASONING_2, PLAIN] = PIECES;
const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
const messages = [{ role: 'user', content: 'Weather in Paris?' }];
const off = { chat_template_kwargs: { enable_thinking: false } };

// ---- a frontend alone -------------------------------------------------------------------

// Starts vlmd-frontend on a model with no router behind it; resolves with its URL.
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

async function stopFrontend(fe) {
  fe.child.kill('SIGTERM');
  await waitFor('the frontend to exit', () => fe.exited);
  assert.deepEqual(fe.exited, { code: 0, signal: null }, fe.stderr.slice(-2000));
}

test('/tokenize gives each Qwen3 fixture chat its input_ids', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-q3tok-'));
  try {
    for (const model of ['qwen3', 'qwen3_moe', 'qwen3_vl']) {
      const fe = await startFrontend(`${FIXTURES}/${model}`, dir);
      try {
        assert.match(fe.stderr, model === 'qwen3_vl' ? /chat template: qwen3_vl / : /chat template: qwen3 /);
        const ref = JSON.parse(readFileSync(`${FIXTURES}/${model}/reference.json`, 'utf8'));
        for (const [i, c] of ref.cases.entries()) {
          const thinks = model !== 'qwen3_vl'; // Qwen3-VL-Instruct's template has no switch
          // an image part as a client sends it: its file's bytes in a data: URI
          const sent = c.messages.map((m) => !Array.isArray(m.content) ? m : { ...m, content: m.content.map((p) =>
            p.type !== 'image' ? p : { type: 'image_url', image_url: { url:
              `data:image/png;base64,${readFileSync(`${FIXTURES}/${model}/${p.image}`).toString('base64')}` } }) });
          const r = await postJson(`${fe.url}/tokenize`, { messages: sent, ...(thinks ? off : {}) });
          assert.equal(r.status, 200, JSON.stringify(r.body));
          assert.deepEqual(r.body.tokens, c.input_ids, `${model} case ${i}`);
          if (!thinks) continue;
          // thinking on (the default): the same prompt without the empty think block
          const on = await postJson(`${fe.url}/tokenize`, { messages: c.messages });
          const [blank, think, unthink] = [c.input_ids.at(-1), ref.special_ids['<think>'], ref.special_ids['</think>']];
          assert.deepEqual(c.input_ids.slice(-4), [think, blank, unthink, blank], 'an empty think block ends it');
          assert.deepEqual(on.body.tokens, c.input_ids.slice(0, -4), `${model} case ${i}, thinking on`);
        }
        if (model === 'qwen3_vl') { // it fetches nothing: a URL image is refused, naming it
          const url = await postJson(`${fe.url}/tokenize`, { messages: [{ role: 'user', content: [
            { type: 'image_url', image_url: { url: 'http://127.0.0.1:9/x.png' } }] }] });
          assert.equal(url.status, 400, JSON.stringify(url.body));
          assert.equal(url.body.error.param, 'messages[0].content[0].image_url');
        }
        const bad = await postJson(`${fe.url}/tokenize`, { messages, chat_template_kwargs: { enable_thinking: 'no' } });
        assert.equal(bad.status, 400);
        assert.equal(bad.body.error.param, 'chat_template_kwargs.enable_thinking');
      } finally {
        await stopFrontend(fe);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// ---- the scripted thinking model ----------------------------------------------------------

let dir, server, client, think;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vlmd-reasoning-'));
  const ref = JSON.parse(readFileSync(`${FIXTURES}/qwen3/reference.json`, 'utf8'));
  think = ref.special_ids['<think>'];
  const unthink = ref.special_ids['</think>'];
  // the prompts' last tokens: "\n" of "<|im_start|>assistant\n", and (thinking off) "\n\n"
  const ids = ref.cases[0].input_ids, newline = ids.at(-5), blank = ids.at(-1);
  writeScriptedModel(dir, { tokenizer: 'qwen3', pieces: PIECES, vocab: 1048, edges: [
    [newline, think, 10], [newline, { piece: 3 }, 5], // <think> first; banned, the runner-up
    [think, { piece: 0 }, 10], [{ piece: 0 }, unthink, 10], [{ piece: 3 }, unthink, 10],
    [unthink, { piece: 1 }, 10], [{ piece: 1 }, { piece: 2 }, 10], [{ piece: 2 }, 'end', 10],
    [blank, { piece: 4 }, 10], [{ piece: 4 }, 'end', 10],
  ] });
  server = await startServer(['--model', dir, '--port', '0', '--served-model-name', 'thinker']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  rmSync(dir, { recursive: true, force: true });
});

const ask = (extra = {}) => client.chat.completions.create({ model: 'thinker', messages, temperature: 0, ...extra });

// A stream read through the SDK: each delta kind accumulated, chunks that carry a delta counted.
async function streamed(extra = {}) {
  const out = { reasoning: '', content: '', calls: [], finish: null, deltas: 0, usage: null, reasoningAfterContent: false };
  for await (const chunk of await ask({ ...extra, stream: true, stream_options: { include_usage: true } })) {
    out.usage = chunk.usage ?? out.usage;
    for (const c of chunk.choices) {
      if (c.finish_reason) out.finish = c.finish_reason;
      else out.deltas++;
      if (c.delta.reasoning_content && out.content) out.reasoningAfterContent = true;
      out.reasoning += c.delta.reasoning_content ?? '';
      out.content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) { // a name begins a call; its arguments come in pieces
        if (t.function.name) out.calls.push([t.function.name, '']);
        out.calls[t.index][1] += t.function.arguments ?? '';
      }
    }
  }
  out.calls = out.calls.map(([name, args]) => [name, JSON.parse(args)]);
  return out;
}

test('the think block is reasoning_content, the rest content', async () => {
  const r = await ask();
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, REASONING);
  assert.equal(m.content, CONTENT + CALL, 'without tools a call is text');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await streamed();
  assert.equal(s.reasoning, REASONING);
  assert.equal(s.content, CONTENT + CALL);
  assert.equal(s.reasoningAfterContent, false);
  assert.equal(s.finish, 'stop');
  // one chunk per generated token, <think> and </think> too (<|im_end|>'s is the finish chunk)
  assert.equal(s.deltas, s.usage.completion_tokens - 1);
  // the SDK's own accumulation of the stream keeps the content
  const final = await client.chat.completions.stream({ model: 'thinker', messages, temperature: 0 }).finalChatCompletion();
  assert.equal(final.choices[0].message.content, CONTENT + CALL);
});

test('with tools the call after the reasoning is a call', async () => {
  const r = await ask({ tools });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.reasoning_content, REASONING);
  assert.equal(m.content, CONTENT);
  assert.deepEqual(m.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]), [['get_weather', { city: 'Paris' }]]);
  const s = await streamed({ tools });
  assert.equal(s.reasoning, REASONING);
  assert.equal(s.content, CONTENT);
  assert.deepEqual(s.calls, [['get_weather', { city: 'Paris' }]]);
  assert.equal(s.finish, 'tool_calls');
});

test('an answer with only </think> (the prompt opened the block) is split the same way', async () => {
  const bias = { logit_bias: { [think]: -100 } };
  const r = await ask(bias);
  assert.equal(r.choices[0].message.reasoning_content, REASONING_2);
  assert.equal(r.choices[0].message.content, CONTENT + CALL);
  const s = await streamed(bias);
  assert.equal(s.reasoning, REASONING_2);
  assert.equal(s.content, CONTENT + CALL);
});

test('with enable_thinking false there is no reasoning', async () => {
  const r = await ask(off);
  assert.equal(r.choices[0].message.content, PLAIN);
  assert.equal(r.choices[0].message.reasoning_content, undefined);
  const s = await streamed(off);
  assert.equal(s.reasoning, '');
  assert.equal(s.content, PLAIN);
});

test('an answer cut inside its reasoning is all reasoning; stop strings look only at content', async () => {
  const cut = await ask({ max_tokens: 2 });
  assert.equal(cut.choices[0].finish_reason, 'length');
  assert.equal(cut.choices[0].message.reasoning_content, REASONING);
  assert.equal(cut.choices[0].message.content, null);
  const s = await streamed({ max_tokens: 2 });
  assert.equal(s.reasoning, REASONING);
  assert.equal(s.content, '');
  assert.equal(s.deltas, 2);
  // "weather" is in the reasoning too: only the content's stops the answer
  const stop = { stop: ['weather'] };
  const r = await ask(stop);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.reasoning_content, REASONING);
  assert.equal(r.choices[0].message.content, `${CONTENT}<tool_call>\n{"name": "get_`);
  const t = await streamed(stop);
  assert.equal(t.reasoning, REASONING);
  assert.equal(t.content, `${CONTENT}<tool_call>\n{"name": "get_`);
});

test('the Responses API: the reasoning is a reasoning item; reasoning.effort "none" turns thinking off', async () => {
  const rtools = [{ type: 'function', name: 'get_weather', parameters: tools[0].function.parameters }];
  const params = { model: 'thinker', input: messages, temperature: 0, tools: rtools };
  const r = await client.responses.create(params);
  assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'message', 'function_call']);
  assert.deepEqual(r.output[0].content, [{ type: 'reasoning_text', text: REASONING }]);
  assert.equal(r.output_text, CONTENT);
  assert.equal(r.output[2].name, 'get_weather');
  assert.deepEqual(JSON.parse(r.output[2].arguments), { city: 'Paris' });
  // <think>, the reasoning and </think> are the reasoning's tokens
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 3);
  // streamed: reasoning_text deltas first; the SDK's final response is the one above
  const stream = client.responses.stream(params);
  const types = [];
  for await (const ev of stream) types.push(ev.type);
  assert.ok(types.indexOf('response.reasoning_text.delta') < types.indexOf('response.output_text.delta'), types.join());
  const final = await stream.finalResponse();
  assert.deepEqual(final.output.map((i) => [i.type, i.content?.[0]?.text ?? i.arguments]),
    r.output.map((i) => [i.type, i.content?.[0]?.text ?? i.arguments]));
  // effort "none": the prompt closes the think block, the answer is all text
  const off = await client.responses.create({ ...params, tools: undefined, reasoning: { effort: 'none' } });
  assert.deepEqual(off.output.map((i) => i.type), ['message']);
  assert.equal(off.output_text, PLAIN);
  assert.deepEqual(off.reasoning, { effort: 'none', summary: null });
  // the reasoning item goes back in as the next turn's reasoning: accepted with the call's output
  const call = r.output[2];
  const next = await client.responses.create({ ...params, input: [...messages, ...r.output,
    { type: 'function_call_output', call_id: call.call_id, output: '18 C' }] });
  assert.equal(next.status, 'completed');
});
