// demo_model.test.mjs - the demo model (`make demo`'s, random weights) can try every feature
// the server has, through the official SDK: its tokenizer has Qwen's added tokens (<tool_call>,
// <think>, ...) and its chat template is Qwen3.5-0.8B's, so strict tools (zodFunction) are held
// to their schemas from the model's own <tool_call> on, a forced call parses (parse()), the
// thinking switch opens a think block, and a plain chat answers as content. Before: strict
// tools were a 400 (no <tool_call> token in its vocabulary).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import OpenAI from 'openai';
import { z } from 'zod';
import { zodFunction } from 'openai/helpers/zod';
import { BIN, SCALE, startServer, stopServer } from './harness.mjs';

const Weather = z.object({ city: z.string().max(10), days: z.number().int().min(1).max(7) });
const weather = zodFunction({ name: 'get_weather', parameters: Weather });
const messages = [{ role: 'user', content: 'What is the weather in Paris for two days?' }];

let model, server, client;
before(async () => {
  model = mkdtempSync(`${tmpdir()}/vlmd-demo-`);
  execFileSync(`${BIN}/vlmd-make-demo-model`, [model]);
  server = await startServer(['--model', model, '--port', '0', '--device', 'cpu',
    '--served-model-name', 'demo']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0,
    timeout: 60000 * SCALE });
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  rmSync(model, { recursive: true, force: true });
});

test('the demo model takes the Qwen3.5 template', () => {
  assert.match(server.stderr, /chat template: qwen3_5 /);
});

test('a forced strict call parses through the SDK, every seed', async () => {
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.parse({ model: 'demo', messages, seed, temperature: 1,
      max_tokens: 120, tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    const call = r.choices[0].message.tool_calls[0];
    assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
    assert.equal(call.function.name, 'get_weather');
    Weather.parse(call.function.parsed_arguments);
  }
});

test('strict tools under auto are accepted; a call the model makes fits its schema', async () => {
  for (let seed = 0; seed < 4; seed++) {
    // (create, not parse: an answer without a call is free text the budget may cut)
    const r = await client.chat.completions.create({ model: 'demo', messages, seed, temperature: 1,
      max_tokens: 60, tools: [weather] });
    for (const call of r.choices[0].message.tool_calls ?? [])
      Weather.parse(JSON.parse(call.function.arguments));
  }
});

test('the thinking switch: off by default (content), on opens a think block (reasoning)', async () => {
  const plain = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 8,
    temperature: 0, ignore_eos: true });
  assert.ok(plain.choices[0].message.content?.length > 0, JSON.stringify(plain.choices[0]));
  const thinking = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 8,
    temperature: 0, ignore_eos: true, chat_template_kwargs: { enable_thinking: true } });
  assert.ok(thinking.choices[0].message.reasoning_content?.length > 0, JSON.stringify(thinking.choices[0]));
});
