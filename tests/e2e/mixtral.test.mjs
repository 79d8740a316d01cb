// mixtral.test.mjs - Mixtral over HTTP: its SentencePiece-style tokenizer with byte fallback,
// its [INST] template, and the model itself.
//
// /tokenize: each mixtral fixture chat gives the fixture's input_ids.
// The fixture model served (the CPU): a completion of each case's input_ids, greedy with the
// end token ignored, is the fixture's greedy continuation, token for token and as text; the
// template's refusals (tools, roles that do not alternate) name their field.
// A scripted model (scripted_model.mjs) with Mixtral's tokenizer, whose answer holds characters
// the vocabulary lacks (é, 中, an emoji: their UTF-8 bytes' <0xXX> tokens): streamed through the
// official SDK, no delta shows a broken character, and the deltas join to the whole answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { FIXTURES, SCALE, startServer, stopServer, postJson } from './harness.mjs';
import { writeScriptedModel, vocabId } from './scripted_model.mjs';

const REF = JSON.parse(readFileSync(`${FIXTURES}/mixtral/reference.json`, 'utf8'));
const MODEL = `${FIXTURES}/mixtral`;

test('the fixture model: /tokenize, greedy continuations, the template\'s refusals', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0', '--device', 'cpu']);
  try {
    for (const [i, c] of REF.cases.entries()) {
      const t = await postJson(`${server.url}/tokenize`, { messages: c.messages });
      assert.equal(t.status, 200, JSON.stringify(t.body));
      assert.deepEqual(t.body.tokens, c.input_ids, `case ${i}: the prompt's ids`);
      const r = await postJson(`${server.url}/v1/completions`, { prompt: c.input_ids, max_tokens: 12,
        temperature: 0, ignore_eos: true, logprobs: 0 }, { timeoutMs: 60000 * SCALE });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.choices[0].text, c.greedy_continuation_decoded, `case ${i}: the continuation`);
    }
    const chat = await postJson(`${server.url}/v1/chat/completions`,
      { messages: REF.cases[0].messages, max_tokens: 4 });
    assert.equal(chat.status, 200, JSON.stringify(chat.body));
    const tools = await postJson(`${server.url}/v1/chat/completions`, { messages: REF.cases[0].messages,
      tools: [{ type: 'function', function: { name: 'f' } }] });
    assert.equal(tools.status, 400);
    assert.equal(tools.body.error.param, 'tools');
    const twice = await postJson(`${server.url}/v1/chat/completions`, { messages: [
      { role: 'user', content: 'a' }, { role: 'user', content: 'b' }] });
    assert.equal(twice.status, 400);
    assert.match(twice.body.error.param, /^messages/);
    const text = await postJson(`${server.url}/tokenize`, { prompt: 'Hello' });
    assert.equal(text.body.tokens[0], REF.special_ids['<s>'], 'a text prompt starts with <s>');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('characters made of <0xXX> tokens stream whole', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vlmd-mixtral-'));
  const bytes = (s) => [...Buffer.from(s, 'utf8')].map((b) =>
    vocabId('mixtral', `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`));
  const p = (piece) => ({ piece });
  const last = REF.cases[0].input_ids.at(-1); // " [/INST]": every chat prompt ends so
  const chain = [last, p(0), ...bytes('é'), p(1), ...bytes('中'), p(2), ...bytes('😀'), p(3), 'end'];
  writeScriptedModel(dir, { tokenizer: 'mixtral', pieces: ['Caf', ' and ', ' then ', ' ok'], vocab: 800,
    end: '</s>', config: { bos_token_id: 1, eos_token_id: 2 },
    edges: chain.slice(0, -1).map((t, k) => [t, chain[k + 1], 10]) });
  const server = await startServer(['--model', dir, '--port', '0', '--served-model-name', 'mixtral']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
    const ask = { model: 'mixtral', messages: REF.cases[0].messages, temperature: 0 };
    const whole = await client.chat.completions.create(ask);
    assert.equal(whole.choices[0].message.content, 'Café and 中 then 😀 ok');
    assert.equal(whole.choices[0].finish_reason, 'stop', 'ended by </s>');
    let joined = '', deltas = 0;
    for await (const chunk of await client.chat.completions.create({ ...ask, stream: true })) {
      const d = chunk.choices[0]?.delta?.content ?? '';
      assert.ok(!d.includes('\uFFFD'), `a delta shows a broken character: ${JSON.stringify(d)}`);
      joined += d;
      deltas += d ? 1 : 0;
    }
    assert.equal(joined, whole.choices[0].message.content);
    assert.ok(deltas >= 4, `streamed in pieces (${deltas})`);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    rmSync(dir, { recursive: true, force: true });
  }
});
