// structured.test.mjs - constrained decoding end to end through the official
// SDK: the fixture model has random weights, so only the grammar makes its
// answers valid. chat.completions.parse(zodResponseFormat(...)) gives a parsed
// object the zod schema accepts (many seeds, n > 1, streamed too),
// json_object an object, vLLM's structured_outputs / guided_* a choice or a
// regex match, forced tool calls arguments that parse and fit the function's
// parameters with finish_reason "tool_calls"; a schema vlmd cannot hold
// output to is a 400 naming the field and the keyword. A strict tool under
// tool_choice auto is held from the model's own <tool_call> token on (a model
// whose tokenizer has one: the fixture's <|video_pad|> renamed). The Responses
// API's text.format is held the same way (responses.parse with zodTextFormat).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { z } from 'zod';
import { zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { mkdtempSync, readFileSync, writeFileSync, symlinkSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FIXTURES, startServer, stopServer, postJson } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];
const Person = z.object({
  name: z.string().max(12), age: z.number().int().min(0).max(120), pet: z.enum(['cat', 'dog']),
  tags: z.array(z.string().max(6)).max(3), nick: z.string().nullable(),
});
const weather = { type: 'object', properties: { city: { type: 'string', maxLength: 10 },
  days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false };
const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: weather } },
  { type: 'function', function: { name: 'get_time' } },
];
const Weather = z.object({ city: z.string().max(10), days: z.number().int().min(1).max(7) }).strict();

let server, client;
before(async () => {
  server = await startServer(['--model', MODEL, '--port', '0', '--max-model-len', '1024']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
});

test('chat.completions.parse with zodResponseFormat: every seed and choice parses and fits', async () => {
  for (let seed = 0; seed < 6; seed++) {
    const c = await client.chat.completions.parse({ model: 'qwen2', messages, seed, n: 2, temperature: 1,
      max_tokens: 300, response_format: zodResponseFormat(Person, 'person') });
    assert.equal(c.choices.length, 2);
    for (const ch of c.choices) {
      assert.equal(ch.finish_reason, 'stop', ch.message.content);
      assert.ok(ch.message.parsed, ch.message.content);
      assert.deepEqual(Person.parse(JSON.parse(ch.message.content)), ch.message.parsed);
    }
  }
});

test('chat.completions.stream with response_format: the streamed answer parses and fits', async () => {
  const stream = client.chat.completions.stream({ model: 'qwen2', messages, seed: 7, temperature: 1,
    max_tokens: 300, response_format: zodResponseFormat(Person, 'person') });
  let text = '';
  stream.on('content.delta', ({ delta }) => { text += delta; });
  const done = await stream.finalChatCompletion();
  const ch = done.choices[0];
  assert.equal(ch.finish_reason, 'stop');
  assert.equal(text, ch.message.content);
  Person.parse(ch.message.parsed);
});

test('stop strings, logprobs and the prefix cache with a schema: cut as any answer, the model\'s own logprobs, cached prompts hold', async () => {
  const schema = { type: 'object', properties: { a: { const: 'xyz' }, b: { type: 'integer' } },
    required: ['a', 'b'], additionalProperties: false };
  const response_format = { type: 'json_schema', json_schema: { name: 'o', schema } };
  const long = [{ role: 'user', content: 'Say it as JSON. '.repeat(40) }];
  // the stop string ends the answer where it starts, as OpenAI and vLLM do: the value is left cut
  for (const stream of [false, true]) {
    const body = { model: 'qwen2', messages: long, seed: 3, max_tokens: 60, stop: ['xyz'], response_format, stream };
    let content = '', finish;
    if (stream) {
      for await (const chunk of await client.chat.completions.create(body)) {
        content += chunk.choices[0]?.delta?.content ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
    } else {
      const c = await client.chat.completions.create(body);
      content = c.choices[0].message.content;
      finish = c.choices[0].finish_reason;
    }
    assert.equal(finish, 'stop', content);
    assert.match(content, /^\{ ?"a": ?"$/, `streamed: ${stream}`);
  }
  // logprobs stay the model's: a token the grammar forced can be improbable, never impossible
  const first = await client.chat.completions.create({ model: 'qwen2', messages: long, seed: 3,
    max_tokens: 60, response_format, logprobs: true, top_logprobs: 2 });
  const ch = first.choices[0];
  assert.equal(ch.finish_reason, 'stop', ch.message.content);
  assert.equal(JSON.parse(ch.message.content).a, 'xyz');
  assert.ok(ch.logprobs.content.length > 0);
  for (const t of ch.logprobs.content) {
    assert.ok(Number.isFinite(t.logprob) && t.logprob <= 0, JSON.stringify(t));
    assert.equal(t.top_logprobs.length, 2);
  }
  // (the end-of-sequence token that ends the value is among them, as vLLM gives it)
  assert.equal(ch.logprobs.content.map((t) => t.token).join(''), `${ch.message.content}<|im_end|>`);
  // the same prompt again comes from the prefix cache, and the grammar holds the same way
  const again = await client.chat.completions.create({ model: 'qwen2', messages: long, seed: 3,
    max_tokens: 60, response_format, logprobs: true, top_logprobs: 2 });
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(again.usage));
  assert.equal(again.choices[0].message.content, ch.message.content);
});

test('responses.parse and responses.stream with zodTextFormat: the Responses API holds text.format to its schema', async () => {
  for (const temperature of [0, 1]) {
    const r = await client.responses.parse({ model: 'qwen2', input: 'Describe a person as JSON.', temperature,
      max_output_tokens: 300, text: { format: zodTextFormat(Person, 'person') } });
    assert.equal(r.status, 'completed', r.output_text);
    assert.ok(r.output_parsed, r.output_text);
    assert.deepEqual(Person.parse(JSON.parse(r.output_text)), r.output_parsed);
  }
  const stream = client.responses.stream({ model: 'qwen2', input: 'Describe a person as JSON.', temperature: 1,
    max_output_tokens: 300, text: { format: zodTextFormat(Person, 'person') } });
  let streamed = '';
  stream.on('response.output_text.delta', (e) => { streamed += e.delta; });
  const done = await stream.finalResponse();
  assert.equal(streamed, done.output_text);
  assert.deepEqual(Person.parse(JSON.parse(done.output_text)), done.output_parsed);
  const obj = await client.responses.create({ model: 'qwen2', input: 'JSON please', max_output_tokens: 200,
    text: { format: { type: 'json_object' } } });
  const v = JSON.parse(obj.output_text);
  assert.ok(typeof v === 'object' && v !== null && !Array.isArray(v), obj.output_text);
});

test('json_object gives a JSON object', async () => {
  for (let seed = 0; seed < 4; seed++) {
    const c = await client.chat.completions.create({ model: 'qwen2', messages, seed, temperature: 1,
      max_tokens: 200, response_format: { type: 'json_object' } });
    const v = JSON.parse(c.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v), c.choices[0].message.content);
  }
});

test("vLLM's structured_outputs and guided_* hold the answer to a choice or a regex", async () => {
  for (let seed = 0; seed < 4; seed++) {
    const choice = await client.chat.completions.create({ model: 'qwen2', messages, seed, temperature: 1,
      max_tokens: 20, structured_outputs: { choice: ['yes', 'no', 'maybe so'] } });
    assert.ok(['yes', 'no', 'maybe so'].includes(choice.choices[0].message.content));
    const regex = await client.completions.create({ model: 'qwen2', prompt: 'A code:', seed, temperature: 1,
      max_tokens: 20, structured_outputs: { regex: '[A-Z]{2}-[0-9]{3}' } });
    assert.match(regex.choices[0].text, /^[A-Z]{2}-[0-9]{3}$/);
    const guided = await client.chat.completions.create({ model: 'qwen2', messages, seed, temperature: 1,
      max_tokens: 20, guided_choice: ['left', 'right'] });
    assert.ok(['left', 'right'].includes(guided.choices[0].message.content));
  }
});

test('forced tool calls parse and fit their parameters, finish_reason tool_calls', async () => {
  for (let seed = 0; seed < 4; seed++) {
    for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
      const c = await client.chat.completions.create({ model: 'qwen2', messages, seed, temperature: 1,
        max_tokens: 200, tools, tool_choice, parallel_tool_calls: false });
      const ch = c.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch.message));
      assert.equal(ch.message.tool_calls.length, 1);
      const fn = ch.message.tool_calls[0].function;
      if (tool_choice !== 'required') assert.equal(fn.name, 'get_weather');
      const args = JSON.parse(fn.arguments);
      if (fn.name === 'get_weather') Weather.parse(args);
      else assert.equal(fn.name, 'get_time');
    }
  }
});

test('a schema vlmd cannot hold output to is a 400 naming the field and the keyword', async () => {
  const r = await postJson(`${server.url}/v1/chat/completions`, { model: 'qwen2', messages,
    response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'object', properties: { n: { type: 'integer', multipleOf: 3 } } } } } });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'response_format.json_schema.schema');
  assert.match(r.body.error.message, /multipleOf/);
  const both = await postJson(`${server.url}/v1/chat/completions`, { model: 'qwen2', messages,
    response_format: { type: 'json_object' }, guided_regex: 'a+' });
  assert.equal(both.status, 400);
  assert.equal(both.body.error.param, 'response_format');
  const regex = await postJson(`${server.url}/v1/completions`, { model: 'qwen2', prompt: 'x',
    structured_outputs: { regex: '(?=a)b' } });
  assert.equal(regex.status, 400);
  assert.equal(regex.body.error.param, 'structured_outputs.regex');
});

test('a strict tool under auto is held to its schema from the <tool_call> token on', async () => {
  // the fixture with its last added token (<|video_pad|>, unused by text chats) as Qwen's
  // non-special <tool_call>; a bias makes the model open a call at once
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-strict-'));
  for (const f of readdirSync(MODEL)) if (f !== 'tokenizer.json') symlinkSync(join(MODEL, f), join(dir, f));
  const tok = JSON.parse(readFileSync(join(MODEL, 'tokenizer.json'), 'utf8'));
  const open = tok.added_tokens.find((t) => t.content === '<|video_pad|>');
  Object.assign(open, { content: '<tool_call>', special: false });
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok));
  const s = await startServer(['--model', dir, '--served-model-name', 'qwen2', '--port', '0', '--max-model-len', '1024']);
  try {
    const c2 = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 60000 });
    const strict = [{ type: 'function', function: { ...tools[0].function, strict: true } }, tools[1]];
    for (let seed = 0; seed < 4; seed++) {
      const c = await c2.chat.completions.create({ model: 'qwen2', messages, seed, temperature: 1, max_tokens: 200,
        tools: strict, parallel_tool_calls: false, logit_bias: { [open.id]: 100 } });
      const ch = c.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch.message));
      const fn = ch.message.tool_calls[0].function;
      if (fn.name === 'get_weather') Weather.parse(JSON.parse(fn.arguments));
      else assert.equal(typeof JSON.parse(fn.arguments), 'object');
    }
  } finally {
    assert.deepEqual(await stopServer(s), { code: 0, signal: null }, s.stderr.slice(-3000));
    rmSync(dir, { recursive: true, force: true });
  }
});

// At the budget (issue 34): an answer held to a schema is closed by its grammar when only the
// tokens to close it are left (strings closed, required keys given their shortest values), so
// it is complete, with its finish_reason ("stop", or "tool_calls" for a forced call), and says
// grammar_closed; only a budget that cannot even close it cuts it ("length"). For each schema,
// every budget from 1 to 64: below the first one that closes it, a cut; from there on, complete
// and valid (the SDK's parse() takes it); the closes counted in /metrics.
test('answers held to a schema close at max_tokens: complete from the first budget that can close them', async () => {
  const kinds = [
    ['Person', { response_format: zodResponseFormat(Person, 'person') }, (m) => Person.parse(JSON.parse(m.content))],
    ['weather', { response_format: { type: 'json_schema', json_schema: { name: 'w', schema: weather, strict: true } } },
      (m) => Weather.parse(JSON.parse(m.content))],
    ['json_object', { response_format: { type: 'json_object' } }, (m) => assert.equal(typeof JSON.parse(m.content), 'object')],
    ['forced call', { tools, tool_choice: { type: 'function', function: { name: 'get_weather' } } },
      (m) => Weather.parse(JSON.parse(m.tool_calls[0].function.arguments))],
  ];
  const before = await metricValue();
  let closed = 0;
  for (const [name, params, check] of kinds) {
    let first = 0;
    for (let budget = 1; budget <= 64; budget++) {
      const c = await client.chat.completions.create({ model: 'qwen2', messages, seed: budget, temperature: 1,
        max_tokens: budget, ...params });
      const ch = c.choices[0];
      if (ch.finish_reason === 'length') {
        assert.equal(first, 0, `${name}: cut at ${budget} tokens after closing at ${first}: ${JSON.stringify(ch.message)}`);
        continue;
      }
      assert.equal(ch.finish_reason, name === 'forced call' ? 'tool_calls' : 'stop', `${name} at ${budget}`);
      check(ch.message);
      first ||= budget;
      if (ch.grammar_closed) closed++;
    }
    assert.ok(first > 0, `${name}: never complete within 64 tokens`);
  }
  assert.ok(closed > 0, 'some answers were closed by their grammar');
  assert.equal(await metricValue() - before, closed, 'vlmd_grammar_closed_total counts them');
});

async function metricValue() {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  return Number(text.match(/vlmd_grammar_closed_total\{[^}]*\} (\d+)/)[1]);
}
