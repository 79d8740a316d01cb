// qwen3_5.test.mjs - Qwen3.5 (hybrid: Gated DeltaNet + gated attention) served through the
// five processes on the CPU, dense and MoE, at TP 1 and 2: every fixture chat (images as data URIs) gives the
// fixture's input_ids over /tokenize and its greedy continuation over /v1/completions (text) or
// the official SDK's chat (the image cases: the visual worker encodes them), many at once as
// alone; a chat's next turn resumes from the state saved in the first's prefill (cached_tokens);
// /memory_stats shows the state pool.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { FIXTURES, SCALE, startServer, stopServer, postJson, getJson, makeDecoder } from './harness.mjs';

const dataUri = (bytes) => `data:image/png;base64,${Buffer.from(bytes).toString('base64')}`;

// A fixture chat as a client sends it: its image parts as data URIs.
function clientMessages(dir, messages) {
  return messages.map((m) => (typeof m.content === 'string' ? m : { ...m,
    content: m.content.map((p) => (p.type === 'image'
      ? { type: 'image_url', image_url: { url: dataUri(readFileSync(`${dir}/${p.image}`)) } }
      : p)) }));
}

const secondTurns = {}; // each model's second-turn answer at TP 1, which TP 2 must give

for (const [model, tp] of [['qwen3_5', 1], ['qwen3_5_moe', 1], ['qwen3_5', 2], ['qwen3_5_moe', 2]]) {
  test(`${model} at TP ${tp}: every fixture chat's ids and greedy continuation, alone and together; a second turn resumes`, async () => {
    const dir = `${FIXTURES}/${model}`;
    const ref = JSON.parse(readFileSync(`${dir}/reference.json`, 'utf8'));
    const decode = makeDecoder(JSON.parse(readFileSync(`${dir}/tokenizer.json`, 'utf8')));
    const server = await startServer(['--model', dir, '--port', '0', '--max-num-seqs', '3',
      '--tensor-parallel-size', String(tp)]);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0,
      timeout: 60000 * SCALE });
    try {
      const ask = async (c) => {
        const kwargs = c.chat_template_kwargs ?? {};
        if (c.images) { // the model's answer: content, or reasoning where the template thinks
          const r = await client.chat.completions.create({ model, max_tokens: c.greedy_continuation.length,
            messages: clientMessages(dir, c.messages), temperature: 0, ignore_eos: true,
            chat_template_kwargs: kwargs });
          const m = r.choices[0].message;
          assert.equal(r.usage.prompt_tokens, c.input_ids.length, 'image tokens counted');
          return (m.reasoning_content ?? '') + (m.content ?? '');
        }
        const r = await postJson(`${server.url}/v1/completions`, { prompt: c.input_ids,
          max_tokens: c.greedy_continuation.length, temperature: 0, ignore_eos: true },
        { timeoutMs: 60000 * SCALE });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        return r.body.choices[0].text;
      };
      for (const [i, c] of ref.cases.entries()) {
        const t = await postJson(`${server.url}/tokenize`, { messages: clientMessages(dir, c.messages),
          ...(c.chat_template_kwargs ? { chat_template_kwargs: c.chat_template_kwargs } : {}) });
        assert.equal(t.status, 200, JSON.stringify(t.body));
        if (!c.images) assert.deepEqual(t.body.tokens, c.input_ids, `case ${i}: the prompt's ids`);
        assert.equal(await ask(c), decode(c.greedy_continuation), `case ${i} alone`);
      }
      // the thinking switch as each template has it: case 3 asks the other way from the
      // default; an answer that thinks is reasoning_content until </think>
      const c3 = ref.cases[3];
      for (const kwargs of [{}, c3.chat_template_kwargs]) {
        const r = await client.chat.completions.create({ model, max_tokens: 6, temperature: 0,
          ignore_eos: true, messages: c3.messages, chat_template_kwargs: kwargs });
        const m = r.choices[0].message, thinks = kwargs.enable_thinking ?? model === 'qwen3_5_moe';
        const text = thinks ? m.reasoning_content : m.content;
        assert.ok(text && text.length > 0, JSON.stringify(m));
        assert.equal(thinks ? m.content ?? '' : m.reasoning_content ?? '', '', JSON.stringify(m));
      }

      // all at once, three running (--max-num-seqs 3: three state slots), the rest waiting
      const together = await Promise.all(ref.cases.map((c) => ask(c)));
      together.forEach((text, i) => assert.equal(text, decode(ref.cases[i].greedy_continuation),
        `case ${i} among the others`));

      // the next turn of case 3's chat resumes from the state saved at its prompt's 128th token
      const turn = async (messages) => client.chat.completions.create({ model, max_tokens: 4,
        messages, temperature: 0, chat_template_kwargs: c3.chat_template_kwargs ?? {} });
      const first = await turn(c3.messages);
      const answer = first.choices[0].message;
      const second = await turn([...c3.messages, { role: 'assistant', content: answer.content ?? '' },
        { role: 'user', content: 'And in one word?' }]);
      assert.equal(second.usage.prompt_tokens_details?.cached_tokens, 128, JSON.stringify(second.usage));
      const said = JSON.stringify(second.choices[0].message);
      if (tp === 1) secondTurns[model] = said; // (the engine's tests hold it equal to no cache)
      else assert.equal(said, secondTurns[model], 'the second turn as at TP 1: every rank restored');

      const stats = await getJson(`${server.url}/memory_stats`);
      const mem = stats.body.llm.memory;
      assert.equal(mem.state_slots, 6, `three running and three snapshots: ${JSON.stringify(mem)}`);
      assert.ok(Number(mem.state_bytes_per_slot) > 0);
      assert.equal(Number(mem.state_pool_bytes), 7 * Number(mem.state_bytes_per_slot),
        'six slots and the pad slot');
      assert.match(server.stderr, /prefix cache: Qwen3_5\w* resumes a cached prefix only where/);
    } finally {
      assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
    }
  });
}
