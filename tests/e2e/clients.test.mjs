// clients.test.mjs - the client libraries other than the official SDK, each on
// its default structured-output path, against vlmd on the qwen2 fixture
// (random weights: only the grammar makes the answers valid): the AI SDK
// (@ai-sdk/openai-compatible's chat model; @ai-sdk/openai's Responses model),
// LangChain's ChatOpenAI (withStructuredOutput's three methods, the Responses
// API; image content blocks streamed on qwen2_vl) and LlamaIndex's OpenAI (responseFormat; an
// image part on qwen2_vl).
// Every object is checked with its zod schema. Loopback only: each library is
// given the server's base URL and a dummy key, and no retries.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { generateObject, streamObject, generateText, tool, stepCountIs } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOpenAI } from '@ai-sdk/openai';
import { ChatOpenAI } from '@langchain/openai';
import { OpenAI as LlamaOpenAI } from '@llamaindex/openai';
import { HumanMessage } from '@langchain/core/messages';
import { FIXTURES, startServer, stopServer, makeDecoder } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const prompt = 'Describe a person as JSON.';
const Person = z.object({
  name: z.string().max(12), age: z.number().int().min(0).max(120), pet: z.enum(['cat', 'dog']),
  tags: z.array(z.string().max(6)).max(3), nick: z.string().max(12).nullable(),
});
const Weather = z.object({ city: z.string().max(10), days: z.number().int().min(1).max(7) });

let server, baseURL;
before(async () => {
  server = await startServer(['--model', MODEL, '--port', '0', '--max-model-len', '1024']);
  baseURL = `${server.url}/v1`;
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
});

test('AI SDK, openai-compatible: generateObject, streamObject, a required tool call', async () => {
  const vlmd = createOpenAICompatible({ baseURL, name: 'vlmd', supportsStructuredOutputs: true });
  const common = { model: vlmd('qwen2'), maxRetries: 0, temperature: 1, maxOutputTokens: 300 };
  for (const seed of [0, 1]) {
    const { object, finishReason } = await generateObject({ ...common, schema: Person, prompt, seed });
    assert.equal(finishReason, 'stop');
    Person.parse(object);
  }
  // zod 4 writes z.record(z.string(), ...) with propertyNames {type: string}
  const Scores = z.object({ scores: z.record(z.string(), z.int().min(0).max(9)) });
  Scores.parse((await generateObject({ ...common, schema: Scores, prompt, seed: 3 })).object);
  let streamError;
  const stream = streamObject({ ...common, schema: Person, prompt, seed: 2, onError: ({ error }) => { streamError = error; } });
  let partials = 0;
  for await (const _ of stream.partialObjectStream) partials++; // eslint-disable-line no-unused-vars
  assert.equal(streamError, undefined);
  Person.parse(await stream.object);
  assert.ok(partials > 1, 'the object came in pieces');
  for (const seed of [0, 1]) {
    const r = await generateText({ ...common, seed, prompt: 'What is the weather?', toolChoice: 'required',
      tools: { get_weather: tool({ description: 'The weather in a city', inputSchema: Weather }) } });
    assert.equal(r.finishReason, 'tool-calls');
    assert.ok(r.toolCalls.length >= 1, 'required: at least one call (parallel ones allowed)');
    for (const call of r.toolCalls) {
      assert.equal(call.toolName, 'get_weather');
      Weather.parse(call.input);
    }
  }
});

test('AI SDK, @ai-sdk/openai on /v1/responses: generateText, a second turn, a tool loop, generateObject', async () => {
  const openai = createOpenAI({ baseURL, apiKey: 'not-needed' });
  const model = openai.responses('qwen2');
  const text = await generateText({ model, prompt: 'Say hello.', maxOutputTokens: 8, maxRetries: 0 });
  assert.equal(typeof text.text, 'string');
  assert.ok(['stop', 'length'].includes(text.finishReason), text.finishReason);
  assert.ok(text.usage.outputTokens > 0);
  // the next turn sends the answer as an item_reference to the stored response's item
  const next = await generateText({ model, maxOutputTokens: 8, maxRetries: 0,
    messages: [{ role: 'user', content: 'Say hello.' }, ...text.response.messages, { role: 'user', content: 'Again.' }] });
  assert.ok(next.usage.inputTokens > text.usage.inputTokens, 'the first answer is in the prompt');
  // a tool loop: the call comes back as a reference, its result as a function_call_output. One
  // call and greedy: the Responses API takes no seed, and with parallel calls allowed a random
  // model may start a second call that max_output_tokens then cuts (no call parses: length)
  const loop = await generateText({ model, maxOutputTokens: 150, maxRetries: 0, prompt: 'What is the weather?',
    temperature: 0, providerOptions: { openai: { parallelToolCalls: false } },
    stopWhen: stepCountIs(2), prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
    tools: { get_weather: tool({ description: 'The weather in a city', inputSchema: Weather,
      execute: async () => ({ sunny: true }) }) } });
  assert.equal(loop.steps.length, 2);
  Weather.parse(loop.steps[0].toolCalls[0].input);
  assert.equal(loop.steps[1].toolCalls.length, 0);
  for (const temperature of [0, 1]) {
    const { object } = await generateObject({ model: openai('qwen2'), schema: Person, prompt, temperature,
      maxOutputTokens: 300, maxRetries: 0 });
    Person.parse(object);
  }
});

test("LangChain's ChatOpenAI: withStructuredOutput (default, jsonSchema, functionCalling), the Responses API", async () => {
  const llm = new ChatOpenAI({ model: 'qwen2', apiKey: 'not-needed', configuration: { baseURL },
    maxRetries: 0, temperature: 1, maxTokens: 300 });
  for (const method of [undefined, 'jsonSchema', 'functionCalling']) {
    const object = await llm.withStructuredOutput(Person, method && { method }).invoke(prompt);
    Person.parse(object);
  }
  const raw = await llm.withStructuredOutput(Weather, { method: 'functionCalling', includeRaw: true })
    .invoke('What is the weather?');
  Weather.parse(raw.parsed);
  assert.ok(raw.raw.tool_calls.length >= 1); // parallel calls are allowed; the first is parsed
  for (const call of raw.raw.tool_calls) Weather.parse(call.args);
  const responses = new ChatOpenAI({ model: 'qwen2', apiKey: 'not-needed', configuration: { baseURL },
    maxRetries: 0, maxTokens: 8, useResponsesApi: true });
  const msg = await responses.invoke('Say hello.');
  assert.equal(typeof msg.text, 'string');
  assert.ok(msg.usage_metadata.output_tokens > 0);
  const roomy = new ChatOpenAI({ model: 'qwen2', apiKey: 'not-needed', configuration: { baseURL },
    maxRetries: 0, maxTokens: 300, useResponsesApi: true });
  Person.parse(await roomy.withStructuredOutput(Person, { method: 'jsonSchema' }).invoke(prompt));
});

test("LlamaIndex's OpenAI: chat with a zod responseFormat", async () => {
  const llm = new LlamaOpenAI({ model: 'qwen2', apiKey: 'not-needed', baseURL, maxRetries: 0, temperature: 1,
    maxTokens: 300 });
  for (let i = 0; i < 2; i++) {
    const r = await llm.chat({ messages: [{ role: 'user', content: prompt }], responseFormat: Person });
    Person.parse(JSON.parse(r.message.content));
  }
  // zod 4 gives these a format vlmd does not know and a pattern, which holds them
  const Codes = z.object({ code: z.string().startsWith('id-').max(8), ref: z.cuid().max(12) });
  const r = await llm.chat({ messages: [{ role: 'user', content: prompt }], responseFormat: Codes });
  Codes.parse(JSON.parse(r.message.content));
});

test("LlamaIndex's image part (a chat file part) on qwen2_vl gives the reference's greedy answer", async () => {
  const fixture = `${FIXTURES}/qwen2_vl`;
  const want = JSON.parse(readFileSync(`${fixture}/reference.json`, 'utf8')).cases[2];
  const vl = await startServer(['--model', fixture, '--port', '0']);
  try {
    const llm = new LlamaOpenAI({ model: 'qwen2_vl', apiKey: 'not-needed', baseURL: `${vl.url}/v1`, maxRetries: 0,
      temperature: 0, maxTokens: 12 });
    const data = readFileSync(`${fixture}/${want.image}`).toString('base64');
    const r = await llm.chat({ messages: [{ role: 'user', content: [
      { type: 'image', data, mimeType: 'image/png' }, { type: 'text', text: 'What is in this image?' }] }] });
    assert.equal(r.raw.usage.prompt_tokens, want.input_ids.length, 'the image was read');
    assert.equal(typeof r.message.content, 'string');
  } finally {
    assert.deepEqual(await stopServer(vl), { code: 0, signal: null }, vl.stderr.slice(-3000));
  }
});

test("LangChain's image content blocks (v1 standard, base64 and url data blocks), streamed and not, on qwen2_vl", async () => {
  const fixture = `${FIXTURES}/qwen2_vl`;
  const want = JSON.parse(readFileSync(`${fixture}/reference.json`, 'utf8')).cases[2];
  const decode = makeDecoder(JSON.parse(readFileSync(`${fixture}/tokenizer.json`, 'utf8')));
  const vl = await startServer(['--model', fixture, '--port', '0']);
  try {
    const llm = new ChatOpenAI({ model: 'qwen2_vl', apiKey: 'not-needed',
      configuration: { baseURL: `${vl.url}/v1` }, maxRetries: 0, temperature: 0, maxTokens: 12 });
    const data = readFileSync(`${fixture}/${want.image}`).toString('base64');
    const blocks = [
      { type: 'image', mimeType: 'image/png', data },
      { type: 'image', source_type: 'base64', mime_type: 'image/png', data },
      { type: 'image', source_type: 'url', url: `data:image/png;base64,${data}` },
    ];
    for (const block of blocks) {
      const message = () => new HumanMessage({ content: [block, { type: 'text', text: 'What is in this image?' }] });
      let streamed = '';
      for await (const chunk of await llm.stream([message()]))
        streamed += typeof chunk.content === 'string' ? chunk.content : '';
      assert.equal(streamed, decode(want.greedy_continuation), `${JSON.stringify(Object.keys(block))} streamed`);
      const whole = await llm.invoke([message()]);
      assert.equal(whole.content, decode(want.greedy_continuation), `${JSON.stringify(Object.keys(block))}`);
    }
  } finally {
    assert.deepEqual(await stopServer(vl), { code: 0, signal: null }, vl.stderr.slice(-3000));
  }
});
