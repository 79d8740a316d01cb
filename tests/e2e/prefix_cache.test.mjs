// prefix_cache.test.mjs - the prefix cache through the API: a multi-turn chat
// and requests sharing a long system prompt give the same greedy text with
// the cache on and off, the later ones report the tokens the cache gave
// (usage.prompt_tokens_details.cached_tokens), and /metrics counts the hits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { FIXTURES, startServer, stopServer, waitFor } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const SYSTEM = 'You are a careful assistant. ' + 'Answer every question in full sentences. '.repeat(6);

async function conversation(extraFlags) {
  const server = await startServer(['--model', MODEL, '--port', '0', ...extraFlags]);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
  const out = { texts: [], cached: [] };
  try {
    const ask = async (messages) => {
      const r = await client.chat.completions.create({ messages, max_tokens: 12, temperature: 0 });
      out.texts.push(r.choices[0].message.content);
      out.cached.push(r.usage.prompt_tokens_details.cached_tokens);
      return r.choices[0].message.content;
    };
    const chat = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Tell me about cats.' }];
    for (let turn = 0; turn < 3; turn++) {
      chat.push({ role: 'assistant', content: await ask(chat) });
      chat.push({ role: 'user', content: `And then, part ${turn}?` });
    }
    for (const q of ['What is rain?', 'Why is the sky blue?'])
      await ask([{ role: 'system', content: SYSTEM }, { role: 'user', content: q }]);
    // the engine's counters reach /metrics with its next heartbeat
    const total = out.cached.reduce((a, b) => a + b, 0);
    out.hits = await waitFor('the cache counters', async () => {
      const text = await fetch(`${server.url}/metrics`).then((r) => r.text());
      const hits = Number(text.match(/vlmd_llm_prefix_cache_hit_tokens_total\{rank="0"\} (\d+)/)?.[1]);
      return hits === total ? String(hits) : false;
    }, 5000);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
  return out;
}

test('a multi-turn chat and a shared system prompt: the same text, fewer tokens computed', async () => {
  const off = await conversation(['--disable-prefix-cache']);
  const on = await conversation([]);
  assert.deepEqual(on.texts, off.texts, 'greedy text is the same with the cache on and off');
  assert.deepEqual(off.cached, [0, 0, 0, 0, 0]);
  assert.equal(on.cached[0], 0, 'the first request finds nothing');
  for (let i = 1; i < 5; i++)
    assert.ok(on.cached[i] > 40, `request ${i} starts from the cached system prompt: ${on.cached[i]}`);
  assert.ok(on.cached[2] > on.cached[1], 'each turn reuses more: the whole chat so far');
  assert.equal(Number(on.hits), on.cached.reduce((a, b) => a + b, 0), '/metrics counts the cached tokens');
});
