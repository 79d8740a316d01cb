// responses.test.mjs - the Responses API through the official SDK (client.responses.create,
// responses.stream, retrieve, delete), and the request shapes client libraries send to chat
// (the developer role, a file part with an image).
//
// A scripted model (scripted_model.mjs) answers any chat with
//     Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>
// in four tokens (the arguments in two), so an answer's text, its call and what a stream of it
// says are known. A request's prompt is checked through usage: the Responses request and the
// chat request that says the same have as many input tokens. Images run on the qwen2_vl fixture,
// whose greedy answer to its reference image Hugging Face computed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { FIXTURES, startServer, stopServer, postJson, getJson, makeDecoder } from './harness.mjs';
import { writeScriptedModel, chainEdges, vocabId } from './scripted_model.mjs';

const PIECES = ['Let me check.', '<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris", ',
  '"days": [1, 2]}}\n</tool_call>'];
const ANSWER = PIECES.join('');
const ARGUMENTS = '{"city": "Paris", "days": [1, 2]}';
const MODEL = 'scripted';
const rtools = [{ type: 'function', name: 'get_weather', description: 'Weather now', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
const ctools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather now', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];

let dir, server, client;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vlmd-responses-'));
  const answer = [vocabId('qwen2', 'Ċ'), ...PIECES.map((_, piece) => ({ piece })), 'end'];
  writeScriptedModel(dir, { pieces: PIECES, edges: chainEdges([answer]) });
  server = await startServer(['--model', dir, '--port', '0', '--served-model-name', MODEL,
    '--responses-store-entries', '8']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  rmSync(dir, { recursive: true, force: true });
});

// The prompt tokens of the chat request that says the same.
async function chatPromptTokens(body) {
  const r = await client.chat.completions.create({ model: MODEL, max_tokens: 1, ...body });
  return r.usage.prompt_tokens;
}

// A response's output without the ids each request makes anew (and what the SDK's stream
// helper adds: parsed, parsed_arguments).
const shape = (output) => output.map(({ id, call_id: callId, parsed_arguments: pa, ...rest }) => {
  assert.ok(id, 'every item has an id');
  if (rest.content) rest.content = rest.content.map(({ parsed, ...part }) => part);
  return rest;
});

test('a string input: a message with the answer, usage and the echoed fields', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Weather in Paris?', temperature: 0, top_p: 0.5,
    metadata: { team: 'a' }, user: 'u1' });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'completed');
  assert.equal(r.model, MODEL);
  assert.equal(r.output_text, ANSWER, 'without tools a call is text');
  assert.deepEqual(shape(r.output), [{ type: 'message', status: 'completed', role: 'assistant',
    content: [{ type: 'output_text', text: ANSWER, annotations: [], logprobs: [] }] }]);
  assert.equal(r.usage.input_tokens, await chatPromptTokens({ messages: [{ role: 'user', content: 'Weather in Paris?' }] }));
  assert.equal(r.usage.output_tokens, PIECES.length + 1, 'the pieces and <|im_end|>');
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.usage.input_tokens_details.cached_tokens >= 0, true);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(r.temperature, 0);
  assert.equal(r.top_p, 0.5);
  assert.deepEqual(r.metadata, { team: 'a' });
  assert.equal(r.user, 'u1');
  assert.equal(r.tool_choice, 'auto');
  assert.deepEqual(r.tools, []);
  assert.deepEqual(r.text, { format: { type: 'text' } });
  assert.equal(r.parallel_tool_calls, true);
  assert.equal(r.store, true);
  assert.equal(r.error, null);
  assert.equal(r.incomplete_details, null);
});

test('items and instructions make the chat prompt; developer is a system turn in chat too', async () => {
  const input = [{ role: 'developer', content: 'Answer briefly.' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Weather' }, { type: 'input_text', text: 'in Paris?' }] }];
  const r = await client.responses.create({ model: MODEL, instructions: 'You are a forecaster.', input });
  assert.equal(r.output_text, ANSWER);
  assert.equal(r.instructions, 'You are a forecaster.');
  const messages = [{ role: 'system', content: 'You are a forecaster.' }, { role: 'system', content: 'Answer briefly.' },
    { role: 'user', content: [{ type: 'text', text: 'Weather' }, { type: 'text', text: 'in Paris?' }] }];
  assert.equal(r.usage.input_tokens, await chatPromptTokens({ messages }));
  // chat takes "developer" as the system turn it is
  const developer = [{ role: 'developer', content: 'Answer briefly.' }, { role: 'user', content: 'Hi' }];
  assert.equal(await chatPromptTokens({ messages: developer }),
    await chatPromptTokens({ messages: [{ role: 'system', content: 'Answer briefly.' }, { role: 'user', content: 'Hi' }] }));
  // and the tokens differ from having no such turn (the turn is written, not dropped)
  assert.notEqual(await chatPromptTokens({ messages: developer }), await chatPromptTokens({ messages: developer.slice(1) }));
});

test('max_output_tokens cuts the answer: status incomplete', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Weather?', max_output_tokens: 2 });
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.max_output_tokens, 2);
  assert.equal(r.output_text, PIECES[0] + PIECES[1]);
  assert.equal(r.output[0].status, 'incomplete');
  assert.equal(r.usage.output_tokens, 2);
});

test('a tool round trip: function_call, then function_call_output in the next input', async () => {
  const user = { role: 'user', content: 'Weather in Paris?' };
  const r = await client.responses.create({ model: MODEL, input: [user], tools: rtools });
  assert.equal(r.status, 'completed');
  assert.deepEqual(shape(r.output), [
    { type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'Let me check.', annotations: [], logprobs: [] }] },
    { type: 'function_call', status: 'completed', name: 'get_weather', arguments: ARGUMENTS }]);
  const call = r.output[1];
  assert.match(call.call_id, /^call_/);
  assert.match(call.id, /^fc_/);
  assert.deepEqual(r.tools, rtools);
  // the SDK's parse of a call's arguments (strict tools) is the model's JSON
  const next = [user, ...r.output, { type: 'function_call_output', call_id: call.call_id, output: '18 C' }];
  const r2 = await client.responses.create({ model: MODEL, input: next, tools: rtools });
  assert.equal(r2.status, 'completed');
  const messages = [user, { role: 'assistant', content: 'Let me check.', tool_calls: [{ id: call.call_id, type: 'function',
    function: { name: 'get_weather', arguments: ARGUMENTS } }] }, { role: 'tool', tool_call_id: call.call_id, content: '18 C' }];
  assert.equal(r2.usage.input_tokens, await chatPromptTokens({ messages, tools: ctools }));
  // a named tool_choice forces that call: its prompt is chat's
  const forced = await client.responses.create({ model: MODEL, input: [user], tools: rtools, max_output_tokens: 1,
    tool_choice: { type: 'function', name: 'get_weather' } });
  assert.deepEqual(forced.tool_choice, { type: 'function', name: 'get_weather' });
  assert.equal(forced.usage.input_tokens, await chatPromptTokens({ messages: [user], tools: ctools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } }));
});

test('responses.stream(): the event sequence, and its final response is the one not streamed', async () => {
  const params = { model: MODEL, input: 'Weather in Paris?', tools: rtools };
  const stream = client.responses.stream(params);
  const events = [];
  for await (const ev of stream) events.push(ev);
  const final = await stream.finalResponse();
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 5), ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added', 'response.output_text.delta']);
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i), 'sequence numbers count up');
  assert.equal(events[0].response.status, 'in_progress');
  // one text delta for the token that says it; the call's name first, its arguments in two pieces
  assert.deepEqual(events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta), ['Let me check.']);
  const added = events.filter((e) => e.type === 'response.output_item.added').map((e) => e.item);
  assert.deepEqual(added.map((i) => [i.type, i.name ?? null, i.arguments ?? null]),
    [['message', null, null], ['function_call', 'get_weather', '']]);
  const pieces = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta);
  assert.deepEqual(pieces, ['{"city": "Paris", ', '"days": [1, 2]}']);
  const done = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(done.arguments, ARGUMENTS);
  assert.equal(done.output_index, 1);
  assert.deepEqual(types.filter((t) => t.endsWith('.done')), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.function_call_arguments.done', 'response.output_item.done']);
  // the SDK's accumulation of the events is the response not streamed
  const whole = await client.responses.create(params);
  assert.equal(final.status, 'completed');
  assert.equal(final.output_text, whole.output_text);
  assert.deepEqual(shape(final.output), shape(whole.output));
  assert.deepEqual(final.usage, whole.usage);
  // cut short, the stream ends with response.incomplete
  const cut = client.responses.stream({ model: MODEL, input: 'Weather?', max_output_tokens: 1 });
  const cutTypes = [];
  for await (const ev of cut) cutTypes.push(ev.type);
  assert.equal(cutTypes.at(-1), 'response.incomplete');
  assert.equal((await cut.finalResponse()).output_text, PIECES[0]);
});

test('previous_response_id continues a stored response; retrieve and delete it', async () => {
  const user = { role: 'user', content: 'Weather in Paris?' };
  const r1 = await client.responses.create({ model: MODEL, input: [user], tools: rtools });
  const call = r1.output.find((i) => i.type === 'function_call');
  const r2 = await client.responses.create({ model: MODEL, previous_response_id: r1.id, tools: rtools,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '18 C' }] });
  assert.equal(r2.previous_response_id, r1.id);
  const messages = [user, { role: 'assistant', content: 'Let me check.', tool_calls: [{ id: call.call_id, type: 'function',
    function: { name: 'get_weather', arguments: ARGUMENTS } }] }, { role: 'tool', tool_call_id: call.call_id, content: '18 C' }];
  assert.equal(r2.usage.input_tokens, await chatPromptTokens({ messages, tools: ctools }));
  // a chain: r3 continues r2, which carries r1's items
  const r3 = await client.responses.create({ model: MODEL, previous_response_id: r2.id, tools: rtools, input: 'Thanks!' });
  const call2 = r2.output.find((i) => i.type === 'function_call');
  messages.push({ role: 'assistant', content: 'Let me check.', tool_calls: [{ id: call2.call_id, type: 'function',
    function: { name: 'get_weather', arguments: ARGUMENTS } }] }, { role: 'user', content: 'Thanks!' });
  assert.equal(r3.usage.input_tokens, await chatPromptTokens({ messages, tools: ctools }));
  // retrieve: the response as it was answered
  const got = await client.responses.retrieve(r1.id);
  assert.deepEqual(got.output, r1.output);
  assert.equal(got.usage.input_tokens, r1.usage.input_tokens);
  await client.responses.delete(r1.id);
  await assert.rejects(client.responses.retrieve(r1.id), (e) => e.status === 404);
  await assert.rejects(client.responses.create({ model: MODEL, previous_response_id: r1.id, input: 'again' }),
    (e) => e.status === 400 && e.param === 'previous_response_id' && e.code === 'previous_response_not_found');
  // "store": false keeps nothing
  const unstored = await client.responses.create({ model: MODEL, input: 'x', store: false });
  assert.equal(unstored.store, false);
  await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);
  // a streamed response is stored too
  const s = client.responses.stream({ model: MODEL, input: 'streamed' });
  for await (const _ of s);
  const streamed = await s.finalResponse();
  const kept = await client.responses.retrieve(streamed.id);
  assert.deepEqual(shape(kept.output), shape(streamed.output));
  assert.deepEqual(kept.output.map((i) => i.id), streamed.output.map((i) => i.id));
  // at most --responses-store-entries (8) are kept: the oldest go first
  const ids = [];
  for (let i = 0; i < 9; i++) ids.push((await client.responses.create({ model: MODEL, input: `n${i}`, max_output_tokens: 1 })).id);
  await assert.rejects(client.responses.retrieve(ids[0]), (e) => e.status === 404);
  assert.equal((await client.responses.retrieve(ids[8])).id, ids[8]);
});

test('errors name the field, as chat\'s do, and the server keeps serving', async () => {
  const cases = [
    [{ model: 'other', input: 'x' }, 404, 'model'],
    [{ model: MODEL }, 400, 'input'],
    [{ model: MODEL, input: 'x', text: { format: { type: 'json_schema', name: 'w', schema: { type: 'integer', multipleOf: 2 } } } }, 400,
      'text.format.schema'],
    [{ model: MODEL, input: 'x', text: { format: { type: 'yaml' } } }, 400, 'text.format.type'],
    [{ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }, 400, 'tools[0].type'],
    [{ model: MODEL, input: 'x', truncation: 'auto' }, 400, 'truncation'],
    [{ model: MODEL, input: 'x', background: true }, 400, 'background'],
    [{ model: MODEL, input: 'x', max_output_tokens: 0 }, 400, 'max_output_tokens'],
    [{ model: MODEL, input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'file-1' }] }] }, 400, 'input[0].content[0].file_id'],
    [{ model: MODEL, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AAAA' }] }] }, 400,
      'input[0].content[0].image_url'], // a text-only model
    [{ model: MODEL, input: 'x', tool_choice: 'required' }, 400, 'tool_choice'],
  ];
  for (const [body, status, param] of cases) {
    const r = await postJson(`${server.url}/v1/responses`, body);
    assert.equal(r.status, status, JSON.stringify(body));
    assert.equal(r.body.error.param, param, JSON.stringify(r.body));
    assert.equal(r.body.error.type, status === 404 ? 'invalid_request_error' : 'invalid_request_error');
  }
  const bad = await getJson(`${server.url}/v1/responses/resp_nope`);
  assert.equal(bad.status, 404);
  assert.equal(bad.body.error.code, 'response_not_found');
  assert.equal((await getJson(`${server.url}/v1/responses/x/input_items`)).status, 404);
  assert.equal((await getJson(`${server.url}/v1/responses`)).status, 405);
  const ok = await client.responses.create({ model: MODEL, input: 'still there?' });
  assert.equal(ok.status, 'completed');
});

test('images: input_image in a response, created and streamed, a file part in chat, on qwen2_vl', async () => {
  const fixture = `${FIXTURES}/qwen2_vl`;
  const reference = JSON.parse(readFileSync(`${fixture}/reference.json`, 'utf8'));
  const decode = makeDecoder(JSON.parse(readFileSync(`${fixture}/tokenizer.json`, 'utf8')));
  const want = reference.cases[2];
  const png = `data:image/png;base64,${readFileSync(`${fixture}/${want.image}`).toString('base64')}`;
  const vl = await startServer(['--model', fixture, '--port', '0']);
  const vlClient = new OpenAI({ baseURL: `${vl.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  try {
    const r = await vlClient.responses.create({ input: [{ role: 'user', content: [
      { type: 'input_image', image_url: png, detail: 'auto' }, { type: 'input_text', text: 'What is in this image?' }] }],
    max_output_tokens: 12, temperature: 0 });
    assert.equal(r.output_text, decode(want.greedy_continuation));
    assert.equal(r.usage.input_tokens, want.input_ids.length, 'the image\'s tokens counted as HF does');
    // the same image as an input_file, and as a chat file part
    const f = await vlClient.responses.create({ input: [{ role: 'user', content: [
      { type: 'input_file', file_data: png, filename: 'a.png' }, { type: 'input_text', text: 'What is in this image?' }] }],
    max_output_tokens: 12, temperature: 0 });
    assert.equal(f.output_text, r.output_text);
    // streamed (responses.stream), the same text delta by delta
    const stream = vlClient.responses.stream({ input: [{ role: 'user', content: [
      { type: 'input_image', image_url: png }, { type: 'input_text', text: 'What is in this image?' }] }],
    max_output_tokens: 12, temperature: 0 });
    let deltas = '';
    stream.on('response.output_text.delta', (ev) => { deltas += ev.delta; });
    const done = await stream.finalResponse();
    assert.equal(deltas, r.output_text);
    assert.equal(done.output_text, r.output_text);
    assert.equal(done.usage.input_tokens, want.input_ids.length);
    const c = await vlClient.chat.completions.create({ messages: [{ role: 'user', content: [
      { type: 'file', file: { file_data: png, filename: 'a.png' } }, { type: 'text', text: 'What is in this image?' }] }],
    max_tokens: 12, temperature: 0 });
    assert.equal(c.choices[0].message.content, r.output_text);
    assert.equal(c.usage.prompt_tokens, want.input_ids.length);
    // a file of another type is refused naming it; a file_id without data: files are not stored
    const pdf = await postJson(`${vl.url}/v1/chat/completions`, { messages: [{ role: 'user', content: [
      { type: 'file', file: { file_data: 'data:application/pdf;base64,JVBERi0=', filename: 'a.pdf' } }] }] });
    assert.equal(pdf.status, 400);
    assert.equal(pdf.body.error.param, 'messages[0].content[0].file.file_data');
    assert.match(pdf.body.error.message, /application\/pdf/);
    const id = await postJson(`${vl.url}/v1/chat/completions`, { messages: [{ role: 'user', content: [
      { type: 'file', file: { file_id: 'file-abc' } }] }] });
    assert.equal(id.status, 400);
    assert.equal(id.body.error.param, 'messages[0].content[0].file.file_id');
    // a broken image is named as the response's input gave it
    const broken = await postJson(`${vl.url}/v1/responses`, { input: [{ role: 'user', content: [
      { type: 'input_image', image_url: 'data:image/png;base64,iVBORw0KGgo=' }] }] });
    assert.equal(broken.status, 400);
    assert.equal(broken.body.error.param, 'input[0].content[0].image_url');
  } finally {
    assert.deepEqual(await stopServer(vl), { code: 0, signal: null }, vl.stderr.slice(-3000));
  }
});

test('an error after the stream began: an error event, then response.failed', async () => {
  // a model that never stops ("tick tock tick ..."), and a server that gives a request 1 s: its
  // room of 64k tokens takes far longer than that (4096, the fixture's, took under 1 s unloaded)
  const loopDir = mkdtempSync(join(tmpdir(), 'vlmd-responses-loop-'));
  writeScriptedModel(loopDir, { pieces: ['tick ', 'tock '], positions: 65536, edges: [[vocabId('qwen2', 'Ċ'), { piece: 0 }, 10],
    [{ piece: 0 }, { piece: 1 }, 10], [{ piece: 1 }, { piece: 0 }, 10]] });
  const loop = await startServer(['--model', loopDir, '--port', '0', '--request-timeout-s', '1']);
  const loopClient = new OpenAI({ baseURL: `${loop.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  try {
    // the SDK ends the stream at the error event, as an error
    const stream = loopClient.responses.stream({ input: 'go' });
    const events = [];
    for await (const ev of stream) events.push(ev);
    assert.equal(events.at(-1).type, 'error');
    assert.equal(events.at(-1).code, 'timeout');
    assert.match(events.at(-1).message, /--request-timeout-s/);
    assert.ok(events.some((e) => e.type === 'response.output_text.delta' && e.delta === 'tick '));
    await assert.rejects(stream.finalResponse(), (e) => /--request-timeout-s/.test(e.message));
    // on the wire, response.failed follows with the response as it stood
    const raw = await fetch(`${loop.url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input: 'go', stream: true }) }).then((r) => r.text());
    const wire = raw.trim().split('\n\n').map((block) => JSON.parse(block.split('\n')[1].slice('data: '.length)));
    assert.deepEqual(wire.slice(-2).map((e) => e.type), ['error', 'response.failed']);
    const failed = wire.at(-1).response;
    assert.equal(failed.status, 'failed');
    assert.equal(failed.error.code, 'server_error');
    assert.match(failed.error.message, /--request-timeout-s/);
    assert.equal(failed.output[0].type, 'message', 'what came before the error stays');
    // not streamed, the same timeout is a 504
    await assert.rejects(loopClient.responses.create({ input: 'go' }), (e) => e.status === 504);
  } finally {
    assert.deepEqual(await stopServer(loop), { code: 0, signal: null }, loop.stderr.slice(-3000));
    rmSync(loopDir, { recursive: true, force: true });
  }
});
