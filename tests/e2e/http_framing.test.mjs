// http_framing.test.mjs - the HTTP layer under hostile framing: requests whose
// Content-Length / Transfer-Encoding could be read two ways (smuggling behind a
// proxy), and HTTP/1.1 requests without one Host, get a JSON 400 and a closed
// connection; bodies over --max-body-bytes get
// the JSON 413 even from clients that send them without Expect: 100-continue
// (the rest is read and dropped, up to a bound in bytes and time); HTTP/2 streams
// opened and reset at once (rapid reset) cost a connection its GOAWAY past
// --http2-reset-budget, without a log line each, and a client address that
// reconnects to go on its GOAWAY past --http2-address-reset-budget.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { FIXTURES, startServer, stopServer, postJson, getJson, waitFor } from './harness.mjs';

const MODEL = `${FIXTURES}/qwen2`;
const TOKENIZE = JSON.stringify({ prompt: 'hi' });

// Splits raw HTTP/1.1 bytes into responses (status, lower-cased headers, body).
function parseResponses(text) {
  const out = [];
  let rest = text;
  while (rest.startsWith('HTTP/1.1 ')) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const lines = rest.slice(0, end).split('\r\n');
    const headers = Object.fromEntries(lines.slice(1).map((l) => {
      const i = l.indexOf(':');
      return [l.slice(0, i).toLowerCase(), l.slice(i + 1).trim()];
    }));
    const len = Number(headers['content-length'] ?? 0);
    out.push({ status: Number(lines[0].split(' ')[1]), headers, body: rest.slice(end + 4, end + 4 + len) });
    rest = rest.slice(end + 4 + len);
  }
  return out;
}

// Writes request on a new connection and reads until the server closes it
// (or waitMs passes): the responses and whether it closed.
function exchange(url, request, { waitMs = 5000 } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    let data = '';
    const sock = net.connect(Number(port), hostname, () => sock.write(request));
    sock.setEncoding('latin1');
    sock.on('data', (d) => { data += d; });
    const done = (closed) => {
      clearTimeout(timer);
      sock.destroy();
      resolve({ responses: parseResponses(data), closed, data });
    };
    sock.on('end', () => done(true));
    sock.on('error', () => done(true));
    const timer = setTimeout(() => done(false), waitMs);
  });
}

const post = (path, headers, body) =>
  `POST ${path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n${headers}\r\n${body}`;
const chunk = (s) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;
const SMUGGLED = 'GET /health HTTP/1.1\r\nHost: t\r\n\r\n';

test('framing: Content-Length and Transfer-Encoding that could be read two ways get a JSON 400 and a closed connection', async () => {
  const server = await startServer(['--model', MODEL, '--port', '0']);
  try {
    const len = Buffer.byteLength(TOKENIZE);
    const cases = [
      ['both Content-Length and Transfer-Encoding', /Content-Length and Transfer-Encoding/,
        post('/tokenize', `Content-Length: ${len}\r\nTransfer-Encoding: chunked\r\n`, chunk(TOKENIZE) + '0\r\n\r\n')],
      ['Transfer-Encoding first, then Content-Length', /Content-Length and Transfer-Encoding/,
        post('/tokenize', `Transfer-Encoding: chunked\r\nContent-Length: 4\r\n`, chunk(TOKENIZE) + '0\r\n\r\n')],
      ['two different Content-Lengths', /Content-Length/,
        post('/tokenize', `Content-Length: ${len}\r\nContent-Length: 5\r\n`, TOKENIZE)],
      ['two equal Content-Lengths', /Content-Length/,
        post('/tokenize', `Content-Length: ${len}\r\nContent-Length: ${len}\r\n`, TOKENIZE)],
      ['a tab before chunked', /Transfer-Encoding/,
        post('/tokenize', 'Transfer-Encoding:\tchunked\r\n', chunk(TOKENIZE) + '0\r\n\r\n')],
      ['two Transfer-Encodings', /Transfer-Encoding/,
        post('/tokenize', 'Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n', chunk(TOKENIZE) + '0\r\n\r\n')],
      ['a coding before chunked', /Transfer-Encoding/,
        post('/tokenize', 'Transfer-Encoding: gzip, chunked\r\n', chunk(TOKENIZE) + '0\r\n\r\n')],
      ['identity', /Transfer-Encoding/, post('/tokenize', 'Transfer-Encoding: identity\r\n', TOKENIZE)],
      ['a negative Content-Length', /Content-Length/, post('/tokenize', 'Content-Length: -5\r\n', TOKENIZE)],
      ['a Content-Length with a sign', /Content-Length/, post('/tokenize', `Content-Length: +${len}\r\n`, TOKENIZE)],
      ['a Content-Length that is not a number', /Content-Length/, post('/tokenize', 'Content-Length: 1x\r\n', TOKENIZE)],
      ['a folded header line', /fold/, post('/tokenize', `Content-Length: ${len}\r\nX-Note: a\r\n b\r\n`, TOKENIZE)],
    ];
    for (const [what, names, request] of cases) {
      // a request smuggled behind each: it must never be answered
      const r = await exchange(server.url, request + SMUGGLED);
      assert.equal(r.responses.length, 1, `${what}: one answer, nothing smuggled: ${JSON.stringify(r.data)}`);
      const [res] = r.responses;
      assert.equal(res.status, 400, `${what}: ${JSON.stringify(r.data)}`);
      assert.equal(res.headers['content-type'], 'application/json', what);
      const err = JSON.parse(res.body).error;
      assert.equal(err.type, 'invalid_request_error', what);
      assert.equal(err.code, 'invalid_framing', what);
      assert.match(err.message, names, `${what}: the message names the header`);
      assert.equal(res.headers.connection, 'close', what);
      assert.ok(r.closed, `${what}: the connection is closed`);
    }

    // the framings that are not ambiguous still work, and keep the connection
    const plain = await exchange(server.url,
      post('/tokenize', `Content-Length: ${len}\r\n`, TOKENIZE) + SMUGGLED.replace('\r\n\r\n', '\r\nConnection: close\r\n\r\n'));
    assert.deepEqual(plain.responses.map((x) => x.status), [200, 200], JSON.stringify(plain.data));
    const chunked = await exchange(server.url,
      post('/tokenize', 'Transfer-Encoding: Chunked\r\nConnection: close\r\n', chunk('{"prompt":') + chunk('"hi"}') + '0\r\n\r\n'));
    assert.deepEqual(chunked.responses.map((x) => x.status), [200], JSON.stringify(chunked.data));
    assert.equal(JSON.parse(chunked.responses[0].body).count, JSON.parse(plain.responses[0].body).count);

    const metrics = await fetch(`${server.url}/metrics`).then((x) => x.text());
    const refused = Number(metrics.match(/^vlmd_http_framing_refusals_total (\d+)$/m)?.[1]);
    assert.equal(refused, cases.length, 'each refusal is counted');

    // Host (RFC 9112 §3.2): an HTTP/1.1 request without one, or with two, is refused like the
    // framings above; HTTP/1.0 may leave it out (issue 36: both were answered)
    const tokenize = (version, headers) => `POST /tokenize HTTP/${version}\r\n${headers}` +
      `Content-Type: application/json\r\nContent-Length: ${len}\r\n\r\n${TOKENIZE}`;
    for (const [what, request, says] of [
      ['no Host', tokenize('1.1', ''), /must name its host/],
      ['two Hosts', tokenize('1.1', 'Host: a\r\nHost: b\r\n'), /more than one Host/]]) {
      const r = await exchange(server.url, request + SMUGGLED);
      assert.equal(r.responses.length, 1, `${what}: one answer, nothing after it: ${JSON.stringify(r.data)}`);
      assert.equal(r.responses[0].status, 400, `${what}: ${JSON.stringify(r.data)}`);
      const err = JSON.parse(r.responses[0].body).error;
      assert.equal(err.code, 'invalid_host', what);
      assert.match(err.message, says, what);
      assert.ok(r.closed, `${what}: the connection is closed`);
    }
    const old = await exchange(server.url, tokenize('1.0', ''));
    assert.deepEqual(old.responses.map((x) => x.status), [200], `HTTP/1.0 without Host: ${JSON.stringify(old.data)}`);
    assert.equal((await getJson(`${server.url}/health`)).status, 200, 'the server keeps serving');
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

// Sends the head and bodyBytes of body the way urllib does (all of it, reading
// nothing until the last byte is out), then reads the answer. written: whether
// every byte went out; error: the socket error, if any.
function uploadThenRead(url, head, bodyBytes, { chunked = false, waitMs = 20000 } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const sock = net.connect({ port: Number(port), host: hostname, allowHalfOpen: true });
    let data = '', written = false, error = null;
    const done = () => {
      clearTimeout(timer);
      sock.destroy();
      resolve({ written, error, responses: parseResponses(data), data });
    };
    const timer = setTimeout(done, waitMs);
    sock.on('error', (e) => { error = e.code; done(); });
    sock.on('connect', async () => {
      const piece = Buffer.alloc(256 * 1024, 'a');
      const put = (b) => new Promise((ok) => { if (sock.write(b)) ok(); else sock.once('drain', ok); });
      await put(head);
      for (let sent = 0; sent < bodyBytes && !error;) {
        const n = Math.min(piece.length, bodyBytes - sent);
        await put(chunked ? Buffer.concat([Buffer.from(`${n.toString(16)}\r\n`), piece.subarray(0, n), Buffer.from('\r\n')])
          : piece.subarray(0, n));
        sent += n;
      }
      if (chunked) await put('0\r\n\r\n');
      sock.write('', () => {
        if (error) return;
        written = true;
        sock.setEncoding('latin1');
        sock.on('data', (d) => { data += d; });
        sock.on('end', done);
      });
    });
  });
}

test('a body over --max-body-bytes gets the JSON 413 without Expect: 100-continue; the rest is dropped up to a bound', async () => {
  const MiB = 1 << 20;
  const server = await startServer(['--model', MODEL, '--port', '0', '--max-body-bytes', String(MiB),
    '--keepalive-timeout-s', '2']);
  try {
    // as urllib sends it
    const head = (extra) => `POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n`
      + `Connection: close\r\n${extra}\r\n`;
    const tooLarge = (r, what) => {
      assert.equal(r.error, null, `${what}: no reset while sending (${r.error})`);
      assert.ok(r.written, `${what}: the whole body went out`);
      assert.equal(r.responses.length, 1, `${what}: ${JSON.stringify(r.data.slice(0, 300))}`);
      const [res] = r.responses;
      assert.equal(res.status, 413, what);
      assert.equal(res.headers['content-type'], 'application/json', what);
      assert.equal(JSON.parse(res.body).error.code, 'request_too_large', what);
    };
    // 1.5 MiB (read whole, then refused), 5 and 7 MiB (refused from Content-Length alone)
    for (const size of [1.5 * MiB, 5 * MiB, 7 * MiB])
      tooLarge(await uploadThenRead(server.url, head(`Content-Length: ${size}\r\n`), size), `${size} bytes`);
    tooLarge(await uploadThenRead(server.url, head('Transfer-Encoding: chunked\r\n'), 5 * MiB, { chunked: true }),
      '5 MiB chunked');

    // with Expect: 100-continue the 413 comes before the body is sent
    const expect = await exchange(server.url, head(`Content-Length: ${5 * MiB}\r\nExpect: 100-continue\r\n`));
    assert.equal(expect.responses[0]?.status, 413, JSON.stringify(expect.data));
    assert.equal(JSON.parse(expect.responses[0].body).error.code, 'request_too_large');

    // past the bound (8 times --max-body-bytes) the server stops reading and closes
    const huge = await uploadThenRead(server.url, head(`Content-Length: ${40 * MiB}\r\n`), 40 * MiB);
    assert.ok(!huge.written && huge.error, `40 MiB: cut before the end (${huge.error})`);

    // and a client that keeps trickling (ignoring the answer and the server's
    // end of the stream) is closed after --keepalive-timeout-s
    const { port } = new URL(server.url);
    const t0 = Date.now();
    const trickled = await new Promise((resolve) => {
      const sock = net.connect({ port: Number(port), host: '127.0.0.1', allowHalfOpen: true },
        () => sock.write(head(`Content-Length: ${5 * MiB}\r\n`)));
      const tick = setInterval(() => { if (!sock.destroyed) sock.write('a'.repeat(1024)); }, 100);
      const done = (closed) => { clearInterval(tick); clearTimeout(timer); sock.destroy(); resolve(closed); };
      sock.on('close', () => done(true));
      sock.on('error', () => done(true));
      sock.on('data', () => {});
      const timer = setTimeout(() => done(false), 10000);
    });
    const ms = Date.now() - t0;
    assert.ok(trickled, 'a trickling client is closed');
    assert.ok(ms > 1500 && ms < 6000, `closed after ${ms} ms (--keepalive-timeout-s 2)`);

    const metrics = await fetch(`${server.url}/metrics`).then((x) => x.text());
    assert.ok(Number(metrics.match(/^vlmd_http_lingering_closes_total (\d+)$/m)?.[1]) >= 5, 'lingering closes are counted');
    assert.equal((await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 2 })).status, 200);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

// ---- HTTP/2, frame by frame -------------------------------------------------------

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
const frame = (type, flags, stream, payload = Buffer.alloc(0)) => {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream, 5);
  return Buffer.concat([h, payload]);
};
// HPACK literals without indexing, new names (every length here is under 127)
const hpack = (headers) => Buffer.concat(Object.entries(headers).map(([k, v]) =>
  Buffer.concat([Buffer.from([0, k.length]), Buffer.from(k), Buffer.from([v.length]), Buffer.from(v)])));
const H2_DATA = 0, H2_HEADERS = 1, H2_RST_STREAM = 3, H2_SETTINGS = 4, H2_GOAWAY = 7;
const END_STREAM = 1, END_HEADERS = 4, CANCEL = 8, ENHANCE_YOUR_CALM = 11;

// A request on stream id: HEADERS, DATA (the body, END_STREAM), and a RST_STREAM
// right after when cancel.
function h2request(id, path, body, cancel) {
  const headers = hpack({ ':method': 'POST', ':scheme': 'http', ':path': path, ':authority': 'localhost',
    'content-type': 'application/json' });
  return Buffer.concat([frame(H2_HEADERS, END_HEADERS, id, headers), frame(H2_DATA, END_STREAM, id, Buffer.from(body)),
    ...(cancel ? [frame(H2_RST_STREAM, 0, id, Buffer.from([0, 0, 0, CANCEL]))] : [])]);
}

// One HTTP/2 connection: send(bytes); frames (type, flags, stream, payload) as they
// come; closed once the server closes it.
function h2connect(url, localAddress) {
  const { hostname, port } = new URL(url);
  const conn = { frames: [], closed: false };
  let buf = Buffer.alloc(0);
  conn.sock = net.connect({ port: Number(port), host: hostname, localAddress });
  conn.sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 9 && buf.length >= 9 + buf.readUIntBE(0, 3)) {
      const len = buf.readUIntBE(0, 3);
      conn.frames.push({ type: buf[3], flags: buf[4], stream: buf.readUInt32BE(5) & 0x7fffffff, payload: buf.subarray(9, 9 + len) });
      buf = buf.subarray(9 + len);
    }
  });
  conn.sock.on('error', () => { conn.closed = true; });
  conn.sock.on('close', () => { conn.closed = true; });
  conn.sock.write(Buffer.concat([PREFACE, frame(H2_SETTINGS, 0, 0)]));
  conn.goaway = () => conn.frames.find((f) => f.type === H2_GOAWAY);
  // :status 200 is HPACK's static entry 8 (0x88), as h2o sends it
  conn.answered = (id) => conn.frames.some((f) => f.type === H2_HEADERS && f.stream === id && f.payload[0] === 0x88);
  return conn;
}

test('HTTP/2 rapid reset: past --http2-reset-budget streams cancelled before their answer, GOAWAY and close; no log line each', async () => {
  const BUDGET = 50;
  // a long idle timeout: only the budget closes these connections within the test
  const server = await startServer(['--model', MODEL, '--port', '0', '--http2-reset-budget', String(BUDGET),
    '--keepalive-timeout-s', '60']);
  try {
    const body = JSON.stringify({ prompt: 'a rapid reset', max_tokens: 200, temperature: 0 });
    const linesBefore = server.stderr.split('\n').length;

    // fewer cancels than the budget: the connection keeps being served
    const calm = h2connect(server.url);
    calm.sock.write(Buffer.concat(Array.from({ length: BUDGET - 10 }, (_, i) => h2request(2 * i + 1, '/v1/completions', body, true))));
    const next = 2 * (BUDGET - 10) + 1;
    calm.sock.write(h2request(next, '/tokenize', TOKENIZE, false));
    await waitFor('the calm connection\'s answer', () => calm.answered(next) || calm.closed, 10000);
    assert.ok(calm.answered(next) && !calm.goaway(), 'under the budget: served, no GOAWAY');
    calm.sock.destroy();

    // four connections that open and reset streams as fast as they can
    const attackers = Array.from({ length: 4 }, () => h2connect(server.url));
    for (const a of attackers)
      a.sock.write(Buffer.concat(Array.from({ length: 4 * BUDGET }, (_, i) => h2request(2 * i + 1, '/v1/completions', body, true))));
    // others are served meanwhile
    assert.equal((await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 2 })).status, 200);
    await waitFor('every attacker to be closed', () => attackers.every((a) => a.closed), 15000);
    for (const a of attackers) {
      const g = a.goaway();
      assert.ok(g, 'a GOAWAY before the close');
      assert.equal(g.payload.readUInt32BE(4), ENHANCE_YOUR_CALM);
      const last = g.payload.readUInt32BE(0) & 0x7fffffff;
      assert.ok(last >= 2 * BUDGET + 1 && last < 2 * 4 * BUDGET, `not before the budget was spent: last stream ${last}`);
    }

    const metrics = await fetch(`${server.url}/metrics`).then((x) => x.text());
    assert.equal(Number(metrics.match(/^vlmd_http2_reset_budget_closes_total (\d+)$/m)?.[1]), 4);
    assert.ok(Number(metrics.match(/^vlmd_http_cancelled_before_response_total (\d+)$/m)?.[1]) > 4 * BUDGET,
      'the cancels are counted');
    const lines = server.stderr.split('\n').length - linesBefore;
    assert.ok(lines < 20, `${lines} log lines for ${5 * BUDGET} cancels:\n${server.stderr.slice(-2000)}`);
    assert.equal((await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 2 })).status, 200,
      'the server keeps serving');
    await waitFor('the cancelled requests to leave the engine', async () => {
      const m = await fetch(`${server.url}/metrics`).then((r) => r.text());
      return /vlmd_llm_running\{rank="0"\} 0/.test(m);
    }, 20000);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});

test('HTTP/2 rapid reset over reconnects: past --http2-address-reset-budget the address\'s connections get GOAWAY; other addresses are served', async () => {
  const PER_CONN = 20, PER_ADDRESS = 100;
  const server = await startServer(['--model', MODEL, '--port', '0', '--http2-reset-budget', String(PER_CONN),
    '--http2-address-reset-budget', String(PER_ADDRESS), '--keepalive-timeout-s', '60']);
  try {
    const body = JSON.stringify({ prompt: 'a rapid reset', max_tokens: 200, temperature: 0 });
    const cancelled = async () => Number((await fetch(`${server.url}/metrics`).then((x) => x.text()))
      .match(/^vlmd_http_cancelled_before_response_total (\d+)$/m)?.[1]);
    const before = await cancelled();
    const t0 = Date.now();
    // one address opens connection after connection, each resetting streams until it is closed
    const CONNS = 15;
    let goaways = 0;
    for (let k = 0; k < CONNS; k++) {
      const a = h2connect(server.url);
      a.sock.write(Buffer.concat(Array.from({ length: 2 * PER_CONN }, (_, i) => h2request(2 * i + 1, '/v1/completions', body, true))));
      await waitFor(`connection ${k} to be closed`, () => a.closed, 15000);
      const g = a.goaway();
      if (g && g.payload.readUInt32BE(4) === ENHANCE_YOUR_CALM) goaways++;
    }
    const seconds = (Date.now() - t0) / 1000;
    assert.equal(goaways, CONNS, 'every connection got its GOAWAY');
    // with a budget per connection only, each of the 15 would have had 21 streams through
    const through = await cancelled() - before;
    const refill = Math.ceil(PER_ADDRESS * seconds / 60);
    assert.ok(through <= PER_ADDRESS + refill + 2 * PER_CONN,
      `${through} streams reached the server in ${seconds} s (address budget ${PER_ADDRESS}, refill ${refill})`);

    // a new connection from the spent address is closed at its first request, cancelled or not
    const next = h2connect(server.url);
    next.sock.write(h2request(1, '/tokenize', TOKENIZE, false));
    await waitFor('the spent address\'s new connection to be closed', () => next.closed, 10000);
    assert.equal(next.goaway()?.payload.readUInt32BE(4), ENHANCE_YOUR_CALM);
    assert.ok(!next.answered(1), 'not served');

    // another address is served over HTTP/2, and this one over HTTP/1.1
    const other = h2connect(server.url, '127.0.0.2');
    other.sock.write(h2request(1, '/tokenize', TOKENIZE, false));
    await waitFor('the other address\'s answer', () => other.answered(1) || other.closed, 10000);
    assert.ok(other.answered(1) && !other.goaway(), 'another address: served');
    other.sock.destroy();
    assert.equal((await postJson(`${server.url}/v1/completions`, { prompt: 'hi', max_tokens: 2 })).status, 200);

    const metrics = await fetch(`${server.url}/metrics`).then((x) => x.text());
    assert.ok(Number(metrics.match(/^vlmd_http2_address_reset_budget_closes_total (\d+)$/m)?.[1]) >= 1);
    const warnings = server.stderr.split('\n').filter((l) => l.includes('--http2-address-reset-budget'));
    assert.equal(warnings.length, 1, `one warning for the address:\n${warnings.join('\n')}`);
    assert.match(warnings[0], /from 127\.0\.0\.1 /);
  } finally {
    assert.deepEqual(await stopServer(server), { code: 0, signal: null }, server.stderr.slice(-3000));
  }
});
