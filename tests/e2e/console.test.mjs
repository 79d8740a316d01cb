// console.test.mjs - the console at / in a real browser (Debian's chromium,
// headless, driven by playwright-core), against the demo model and the
// qwen2_vl fixture: no console error or CSP violation; a streamed answer that
// is the API's for the same seed; stop cancels (the server counts it); an
// image travels with the message, a too large one shows the server's 400; the
// key's 401 and then success; the memory bars' numbers are /memory_stats';
// a model answer with markup stays text; every control is reachable by
// keyboard. And over plain HTTP: the page's headers (CSP, types, caching by
// hash, gzip, 304), --ui off. VLMD_SCREENSHOT_DIR=docs/images writes the
// README's screenshots.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, readFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { gunzipSync } from 'node:zlib';
import http from 'node:http';
import { chromium } from 'playwright-core';
import { BIN, FIXTURES, SCALE, startServer, stopServer, getJson, postJson, waitFor } from './harness.mjs';

const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
if (!CHROMIUM) throw new Error('the console tests need chromium (deploy/install-deps.sh installs it)');
const SHOTS = process.env.VLMD_SCREENSHOT_DIR;

let browser, demoDir, demo;
before(async () => {
  demoDir = mkdtempSync(`${tmpdir()}/vlmd-console-demo-`);
  execFileSync(`${BIN}/vlmd-make-demo-model`, [demoDir]);
  [browser, demo] = await Promise.all([
    chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-gpu'] }),
    startServer(['--model', demoDir, '--port', '0', '--device', 'cpu', '--served-model-name', 'demo',
      '--max-model-len', '4096']),
  ]);
});
after(async () => {
  await browser?.close();
  if (demo) assert.deepEqual(await stopServer(demo), { code: 0, signal: null }, demo.stderr.slice(-3000));
  rmSync(demoDir, { recursive: true, force: true });
});

// A page of the console with every console message and page error collected.
async function openConsole(url, { storage } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  if (storage) await page.addInitScript((s) => { for (const [k, v] of Object.entries(s)) localStorage.setItem(k, v); }, storage);
  await page.goto(`${url}/`, { waitUntil: 'load' });
  return { context, page, problems };
}

async function metric(url, name, labels) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && labels.every((x) => l.includes(x)));
  return Number(line?.split(' ').pop() ?? NaN);
}

async function setField(page, id, value) {
  await page.fill(id, String(value));
}

async function send(page, text) {
  await page.fill('#prompt', text);
  await page.click('#send');
}

const lastAnswer = (page) => page.locator('.message.assistant').last();

function rawGet(url, headers = {}, method = 'GET') {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end();
  });
}

test('the page and its assets: CSP, types, caching by content hash, gzip, 304; /health says the demo model', async () => {
  const page = await rawGet(`${demo.url}/`);
  assert.equal(page.status, 200);
  assert.match(page.headers['content-type'], /^text\/html; charset=utf-8/);
  const csp = page.headers['content-security-policy'];
  for (const d of ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"])
    assert.ok(csp.includes(d), `CSP has ${d}: ${csp}`);
  assert.equal(page.headers['x-content-type-options'], 'nosniff');
  assert.equal(page.headers['cache-control'], 'no-cache', 'the page is revalidated');
  const html = page.body.toString();
  assert.doesNotMatch(html, /<script>|<script(?![^>]*\bsrc=)[^>]*>|\son[a-z]+=|\sstyle=/i, 'no inline script, handler or style');
  const assets = [...html.matchAll(/(?:src|href)="(\/console\/[^"]+)"/g)].map((m) => m[1]);
  assert.ok(assets.some((a) => a.endsWith('.js')) && assets.some((a) => a.endsWith('.css')), html);
  for (const a of assets) {
    const plain = await rawGet(`${demo.url}${a}`);
    assert.equal(plain.status, 200, a);
    const type = { js: /^text\/javascript/, css: /^text\/css/, txt: /^text\/plain/ }[a.split('.').pop()];
    assert.match(plain.headers['content-type'], type, a);
    assert.match(plain.headers['cache-control'], /immutable/, `${a} is cached for good: its name is its hash`);
    const zipped = await rawGet(`${demo.url}${a}`, { 'accept-encoding': 'gzip, deflate' });
    assert.equal(zipped.headers['content-encoding'], 'gzip');
    assert.ok(zipped.body.length < plain.body.length);
    assert.deepEqual(gunzipSync(zipped.body), plain.body, 'the same bytes');
    const notZipped = await rawGet(`${demo.url}${a}`, { 'accept-encoding': 'gzip;q=0, br' });
    assert.equal(notZipped.headers['content-encoding'], undefined, 'gzip;q=0 is a no');
    const again = await rawGet(`${demo.url}${a}`, { 'if-none-match': plain.headers.etag });
    assert.equal(again.status, 304);
    assert.equal(again.body.length, 0);
  }
  const head = await rawGet(`${demo.url}/`, {}, 'HEAD');
  assert.equal(head.status, 200);
  assert.equal(head.body.length, 0);
  assert.equal((await rawGet(`${demo.url}/console/nothing.js`)).status, 404);
  assert.equal((await rawGet(`${demo.url}/nothing`)).status, 404, '"/" is not a prefix');
  const h = (await getJson(`${demo.url}/health`)).body;
  assert.equal(h.ui, 'on');
  assert.equal(h.demo_model, true);
});

test('chat: a streamed answer is the API\'s for the same seed, with no console error or CSP violation; the demo notice', async () => {
  const { context, page, problems } = await openConsole(demo.url);
  try {
    await page.waitForSelector('#demo-notice:not([hidden])');
    assert.match(await page.textContent('#demo-notice'), /demo model/i);
    await setField(page, '#temperature', 0.8);
    await setField(page, '#seed', 7);
    await setField(page, '#max-tokens', 24);
    // 24 tokens whatever the sampled path (the same field goes to the API below)
    await page.route('**/v1/chat/completions', (route) => route.continue({
      postData: JSON.stringify({ ...JSON.parse(route.request().postData()), ignore_eos: true }) }));
    await send(page, 'Tell me about memory.');
    const answer = lastAnswer(page);
    await answer.and(page.locator('[data-done="true"]')).waitFor({ timeout: 30000 * SCALE });
    const api = await postJson(`${demo.url}/v1/chat/completions`, {
      messages: [{ role: 'user', content: 'Tell me about memory.' }], temperature: 0.8, seed: 7,
      max_tokens: 24, ignore_eos: true, top_p: await page.inputValue('#top-p').then(Number),
      chat_template_kwargs: { enable_thinking: await page.isChecked('#thinking') } });
    assert.equal(api.status, 200, JSON.stringify(api.body));
    const stored = await page.evaluate(() => Object.entries(localStorage)
      .filter(([k]) => k.startsWith('vlmd.console.')).map(([, v]) => v).join('\n'));
    const content = api.body.choices[0].message.content ?? '';
    assert.equal(api.body.usage.completion_tokens, 24);
    assert.ok(content.length > 0);
    assert.ok(stored.includes(JSON.stringify(content).slice(1, -1)), `the page kept the API's answer: ${content}`);
    assert.match(await answer.locator('.stats').textContent(), /\d+ tokens/);
    // the conversation survives a reload
    await page.reload();
    await page.waitForSelector('.message.assistant');
    assert.ok((await page.locator('.message.user').count()) >= 1);
    assert.deepEqual(problems, [], 'no console error, no CSP violation');
  } finally {
    await context.close();
  }
});

test('stop cancels the request: the server counts the cancellation', async () => {
  const { context, page, problems } = await openConsole(demo.url);
  try {
    // as many tokens as the context holds: the answer must still be streaming when stop is
    // clicked (1500 ended by length first once, in a CI-like run beside other tests)
    await setField(page, '#max-tokens', 4000);
    // the demo model may end an answer early (on another CPU, another path): this one may not
    await page.route('**/v1/chat/completions', (route) => route.continue({
      postData: JSON.stringify({ ...JSON.parse(route.request().postData()), ignore_eos: true }) }));
    const before = await metric(demo.url, 'vlmd_requests_finished_total', ['finished_reason="cancelled"']);
    await send(page, 'Go on and on.');
    await page.waitForFunction(() => document.querySelector('#stop') && !document.querySelector('#stop').disabled);
    await waitFor('some streamed text', async () => (await lastAnswer(page).locator('.content').textContent()).length > 0, 20000 * SCALE);
    await page.click('#stop');
    await lastAnswer(page).and(page.locator('[data-done="true"]')).waitFor({ timeout: 10000 * SCALE });
    await waitFor('the cancellation counted', async () =>
      await metric(demo.url, 'vlmd_requests_finished_total', ['finished_reason="cancelled"']) === before + 1, 10000 * SCALE);
    assert.ok(await page.isDisabled('#stop'));
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test('a model answer with markup is shown as text: no script runs, no element is made from it', async () => {
  const { context, page, problems } = await openConsole(demo.url);
  try {
    const evil = 'Look: <img src=x onerror="window.__xss=1"> and <script>window.__xss=2</script> **bold**';
    await page.route('**/v1/chat/completions', (route) => route.fulfill({
      status: 200, contentType: 'text/event-stream',
      body: [{ choices: [{ index: 0, delta: { role: 'assistant', content: evil } }] },
        { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: { prompt_tokens: 3, completion_tokens: 9, total_tokens: 12 } }]
        .map((d) => `data: ${JSON.stringify(d)}\n\n`).join('') + 'data: [DONE]\n\n' }));
    await send(page, 'hi');
    const answer = lastAnswer(page);
    await answer.and(page.locator('[data-done="true"]')).waitFor();
    await page.waitForTimeout(200);
    assert.equal(await page.evaluate(() => window.__xss), undefined, 'nothing of the answer ran');
    assert.equal(await answer.locator('script, img[onerror], [onerror]').count(), 0);
    assert.match(await answer.locator('.content').textContent(), /Look:/);
    assert.equal(await answer.locator('.content strong').count(), 1, 'Markdown is still rendered');
    assert.deepEqual(problems.filter((p) => !/net::ERR|Failed to load resource/.test(p)), []);
  } finally {
    await context.close();
  }
});

test('thinking is folded apart, tool calls are shown as calls, the usage gives the stats', async () => {
  const { context, page, problems } = await openConsole(demo.url);
  try {
    const chunks = [
      { choices: [{ index: 0, delta: { role: 'assistant', reasoning_content: 'Let me think <b>hard</b>.' } }] },
      { choices: [{ index: 0, delta: { content: 'Calling the weather.' } }] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": ' } }] } }] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] } }] },
      { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] },
      { choices: [], usage: { prompt_tokens: 5, completion_tokens: 17, total_tokens: 22 } },
    ];
    await page.route('**/v1/chat/completions', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream',
      body: chunks.map((d) => `data: ${JSON.stringify(d)}\n\n`).join('') + 'data: [DONE]\n\n' }));
    await send(page, 'weather?');
    const answer = lastAnswer(page);
    await answer.and(page.locator('[data-done="true"]')).waitFor();
    const reasoning = answer.locator('details.reasoning');
    assert.equal(await reasoning.count(), 1);
    assert.equal(await reasoning.evaluate((d) => d.open), false, 'folded');
    assert.match(await reasoning.textContent(), /Let me think <b>hard<\/b>\./, 'as text');
    assert.doesNotMatch(await answer.locator('.content').textContent(), /Let me think/, 'apart from the answer');
    const call = answer.locator('.tool-call');
    assert.equal(await call.count(), 1);
    assert.match(await call.textContent(), /get_weather/);
    assert.match(await call.textContent(), /"city": "Paris"/);
    assert.match(await answer.locator('.stats').textContent(), /17 tokens/);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test('conversations: new, rename, delete, kept in the browser', async () => {
  const { context, page, problems } = await openConsole(demo.url);
  try {
    await page.route('**/v1/chat/completions', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream',
      body: `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] })}\n\ndata: [DONE]\n\n` }));
    const count = () => page.locator('#conversations .conversation').count();
    await send(page, 'first conversation');
    await lastAnswer(page).and(page.locator('[data-done="true"]')).waitFor();
    const before = await count();
    await page.click('#new-conversation');
    assert.equal(await page.locator('#messages .message').count(), 0, 'a new one starts empty');
    await send(page, 'second conversation');
    await lastAnswer(page).and(page.locator('[data-done="true"]')).waitFor();
    assert.equal(await count(), before + 1);
    const item = page.locator('#conversations .conversation.current');
    await item.locator('.rename').click();
    await page.fill('#conversations .rename-input', 'Renamed one');
    await page.keyboard.press('Enter');
    await page.reload();
    await page.waitForSelector('#conversations .conversation');
    assert.match(await page.locator('#conversations .conversation.current').textContent(), /Renamed one/, 'kept across a reload');
    assert.match(await page.locator('#messages').textContent(), /second conversation/);
    await page.locator('#conversations .conversation.current .delete').click();
    assert.equal(await count(), before);
    assert.doesNotMatch(await page.locator('#conversations').textContent(), /Renamed one/);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test('keyboard only: Tab reaches every control', async () => {
  const { context, page } = await openConsole(demo.url);
  try {
    const want = ['nav-chat', 'nav-memory', 'new-conversation', 'prompt', 'send', 'image-input',
      'system-prompt', 'temperature', 'top-p', 'max-tokens', 'seed', 'thinking'];
    const reached = new Set();
    for (let i = 0; i < 80 && want.some((id) => !reached.has(id)); i++) {
      await page.keyboard.press('Tab');
      reached.add(await page.evaluate(() => document.activeElement?.id || ''));
    }
    assert.deepEqual(want.filter((id) => !reached.has(id)), [], 'controls Tab never reached');
    // and the memory view opens from the keyboard
    await page.focus('#nav-memory');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#view-memory:not([hidden])');
  } finally {
    await context.close();
  }
});

test('memory: every bar segment and profile number equals /memory_stats; screenshots', async () => {
  const { context, page, problems } = await openConsole(demo.url);
  try {
    if (SHOTS) {
      mkdirSync(SHOTS, { recursive: true });
      await send(page, 'Hello! What can you do?');
      await lastAnswer(page).and(page.locator('[data-done="true"]')).waitFor({ timeout: 30000 * SCALE });
      await page.screenshot({ path: `${SHOTS}/console-chat.png` });
    }
    await page.click('#nav-memory');
    await page.waitForSelector('#memory-devices .device[data-process="llm"] .segment');
    // what the page shows against /memory_stats fetched at the same moment, until a poll of
    // the page's has caught up with the server's latest snapshot (both settle once idle)
    const shown = () => page.evaluate(() => ({
      segments: Object.fromEntries([...document.querySelectorAll('#memory-devices .device[data-process="llm"] .segment')]
        .map((e) => [e.dataset.part, Number(e.dataset.bytes)])),
      fields: Object.fromEntries([...document.querySelectorAll('#profile-timeline [data-field]')]
        .map((e) => [e.dataset.field, e.dataset.value])),
      hitRate: document.querySelector('#prefix-hit-rate')?.dataset.value,
    }));
    const expected = (stats) => {
      const m = stats.llm.memory, c = stats.llm.counters;
      return {
        segments: { weights: m.weights_bytes, workspace: m.workspace_bytes, canary: m.canary_bytes,
          'kv-used': stats.llm.kv_used_bytes, 'kv-free': m.kv_bytes - stats.llm.kv_used_bytes },
        fields: Object.fromEntries(['probe_tokens', 'probe_peak_bytes', 'target_budget_bytes', 'attempts',
          'kv_capacity_tokens'].map((k) => [k, String(m[k])])),
        hitRate: `${c.prefix_cache_hit_tokens_total}/${c.prefix_cache_query_tokens_total}`,
      };
    };
    let last;
    const same = await waitFor('the page\'s numbers to be /memory_stats\'', async () => {
      const want = expected((await getJson(`${demo.url}/memory_stats`)).body);
      const got = await shown();
      const picked = { segments: Object.fromEntries(Object.keys(want.segments).map((k) => [k, got.segments[k]])),
        fields: Object.fromEntries(Object.keys(want.fields).map((k) => [k, got.fields[k]])), hitRate: got.hitRate };
      last = { want, got: picked };
      return JSON.stringify(picked) === JSON.stringify(want);
    }, 15000 * SCALE, 250).catch(() => false);
    assert.ok(same, `the page shows /memory_stats' numbers: ${JSON.stringify(last)}`);
    assert.ok(Number(last.want.hitRate.split('/')[1]) > 0, 'the earlier tests asked the prefix cache');
    if (SHOTS) await page.screenshot({ path: `${SHOTS}/console-memory.png` });
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test('qwen2_vl: an attached image travels with the message; a too large one shows the server\'s 400', async () => {
  const server = await startServer(['--model', `${FIXTURES}/qwen2_vl`, '--port', '0', '--device', 'cpu',
    '--max-image-pixels', '10000']);
  const { context, page, problems } = await openConsole(server.url);
  try {
    await setField(page, '#max-tokens', 4);
    await page.setInputFiles('#image-input', `${FIXTURES}/qwen2_vl/image_84x56.png`);
    await page.waitForSelector('#attachments img');
    const sent = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
    await send(page, 'What is in the image?');
    const body = JSON.parse((await sent).postData());
    const parts = body.messages.at(-1).content;
    const image = parts.find((p) => p.type === 'image_url');
    assert.ok(image, JSON.stringify(parts).slice(0, 300));
    assert.equal(image.image_url.url, `data:image/png;base64,${readFileSync(`${FIXTURES}/qwen2_vl/image_84x56.png`).toString('base64')}`);
    await lastAnswer(page).and(page.locator('[data-done="true"]')).waitFor({ timeout: 30000 * SCALE });
    assert.equal(await page.locator('#error').textContent().then((t) => t.trim()), '');
    // 150x100 is over --max-image-pixels 10000: the server's message, shown as it is
    await page.setInputFiles('#image-input', `${FIXTURES}/qwen2_vl/image_150x100.png`);
    await send(page, 'And this one?');
    await page.waitForFunction(() => document.querySelector('#error')?.textContent.trim().length > 0);
    const api = await postJson(`${server.url}/v1/chat/completions`, { max_tokens: 4, messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: `data:image/png;base64,${readFileSync(`${FIXTURES}/qwen2_vl/image_150x100.png`).toString('base64')}` } }] }] });
    assert.equal(api.status, 400);
    assert.ok((await page.textContent('#error')).includes(api.body.error.message), await page.textContent('#error'));
    assert.deepEqual(problems.filter((p) => !/status of 400/.test(p)), []);
  } finally {
    await context.close();
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('an API key: the page asks for it, shows the 401, then works with the right one', async () => {
  const server = await startServer(['--model', demoDir, '--port', '0', '--device', 'cpu'],
    { env: { VLMD_API_KEY: 'console-secret' } });
  const { context, page, problems } = await openConsole(server.url);
  try {
    await page.waitForSelector('#key-dialog[open], #key-dialog:not([hidden])');
    await page.fill('#key-input', 'wrong');
    await page.click('#key-submit');
    await page.waitForFunction(() => document.querySelector('#key-error')?.textContent.trim().length > 0);
    assert.match(await page.textContent('#key-error'), /API key/i);
    await page.fill('#key-input', 'console-secret');
    await page.click('#key-submit');
    await setField(page, '#max-tokens', 4);
    await send(page, 'hi');
    await lastAnswer(page).and(page.locator('[data-done="true"]')).waitFor({ timeout: 30000 * SCALE });
    assert.ok((await lastAnswer(page).locator('.content').textContent()).length > 0);
    assert.deepEqual(problems.filter((p) => !/status of 401/.test(p)), []);
  } finally {
    await context.close();
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('--ui off: / is a 404 and /health says so', async () => {
  const server = await startServer(['--model', demoDir, '--port', '0', '--device', 'cpu', '--ui', 'off']);
  try {
    assert.equal((await rawGet(`${server.url}/`)).status, 404);
    assert.equal((await getJson(`${server.url}/health`)).body.ui, 'off');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
