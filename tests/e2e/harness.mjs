// harness.mjs - starts `vlmd serve` for a test and talks to it over loopback.
// Every wait is bounded: a test fails with what it last saw, never hangs.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import http from 'node:http';

export const BIN = process.env.VLMD_BIN_DIR;
export const FIXTURES = process.env.VLMD_FIXTURES_DIR;
if (!BIN || !FIXTURES) throw new Error('VLMD_BIN_DIR and VLMD_FIXTURES_DIR must be set (ctest sets them)');

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The default bounds on a start-up and on a request grow with the build's speed: ctest sets
// VLMD_E2E_TIME_SCALE under the sanitizers, whose processes run several times slower.
export const SCALE = Number(process.env.VLMD_E2E_TIME_SCALE || 1);

// Polls fn() until it returns a truthy value or timeoutMs passes.
export async function waitFor(what, fn, timeoutMs = 20000, everyMs = 50) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await sleep(everyMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last: ${JSON.stringify(last?.message ?? last)}`);
}

export function pidAlive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return e.code === 'EPERM';
  }
}

// The command line that runs `vlmd ARGS`, or runs it through wrap: a command
// that ends by exec'ing the rest of its arguments (unshare and a mount, prlimit).
const vlmdCommand = (args, wrap = []) => (wrap.length
  ? [wrap[0], [...wrap.slice(1), `${BIN}/vlmd`, ...args]] : [`${BIN}/vlmd`, args]);

// Starts the launcher; resolves once it prints its ready line, with the URL.
// env adds variables to the launcher's environment (its children inherit them);
// wrap, a command that execs the launcher (the child's pid stays the launcher's).
export async function startServer(args, { readyTimeoutMs = 30000 * SCALE, env = {}, wrap = [] } = {}) {
  const child = spawn(...vlmdCommand(['serve', ...args], wrap),
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  const server = { child, stdout: '', stderr: '', url: null, exited: null };
  child.stdout.on('data', (d) => { server.stdout += d; });
  child.stderr.on('data', (d) => { server.stderr += d; });
  child.on('exit', (code, signal) => { server.exited = { code, signal }; });
  server.url = await waitFor('the ready line', () => {
    if (server.exited) throw new Error(`vlmd exited early (${JSON.stringify(server.exited)}):\n${server.stderr}`);
    const m = server.stdout.match(/vlmd is ready: (http:\/\/\S+)/);
    return m && m[1];
  }, readyTimeoutMs);
  return server;
}

// Sends SIGTERM and waits for the launcher to exit; returns its exit code.
export async function stopServer(server, timeoutMs = 20000) {
  if (!server.exited) {
    server.child.kill('SIGTERM');
    await waitFor('the launcher to exit', () => server.exited, timeoutMs)
      .catch((e) => { throw new Error(`${e.message}\n${server.stderr.slice(-4000)}`); });
  }
  return server.exited;
}

// Runs the launcher to completion (for start-up failures); env and wrap as startServer's.
export async function runToExit(args, timeoutMs = 20000, { env = {}, wrap = [] } = {}) {
  const child = spawn(...vlmdCommand(args, wrap),
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stdout = '', stderr = '';
  child.stdout.on('data', (d) => { stdout += d; });
  child.stderr.on('data', (d) => { stderr += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const [code, signal] = await once(child, 'exit');
  clearTimeout(timer);
  return { code, signal, stdout, stderr };
}

// One request on its own connection, closed afterwards (no keep-alive pool),
// so a server stopping after it has no connection left open.
// headers adds request headers; raw (a string) is sent as the body as it is.
export function getJson(url, { method = 'GET', timeoutMs = 5000 * SCALE, body, headers: extra = {}, raw } = {}) {
  return new Promise((resolve, reject) => {
    const headers = { connection: 'close', ...extra };
    if (body !== undefined || raw !== undefined) headers['content-type'] = 'application/json';
    const req = http.request(url, { method, agent: false, headers, timeout: timeoutMs }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        try {
          resolve({ status: res.statusCode, headers: res.headers, body: text ? JSON.parse(text) : null });
        } catch (e) {
          reject(new Error(`${method} ${url}: not JSON: ${text.slice(0, 200)}`));
        }
      });
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${url} timed out`)));
    req.on('error', reject);
    req.end(raw !== undefined ? raw : body === undefined ? undefined : JSON.stringify(body));
  });
}

export const postJson = (url, body, opts = {}) => getJson(url, { ...opts, method: 'POST', body });

// Byte-level BPE decoding from a tokenizer.json, independent of the server's
// own tokenizer: ids -> vocab symbols -> bytes (GPT-2's bytes_to_unicode).
export function makeDecoder(tokenizerJson) {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const byteOf = new Map(cs.map((c, i) => [String.fromCodePoint(c), bs[i]]));
  const symbol = new Map(Object.entries(tokenizerJson.model.vocab).map(([k, v]) => [v, k]));
  const special = new Set(tokenizerJson.added_tokens.filter((t) => t.special).map((t) => t.id));
  // added tokens that are not special (Qwen3's <think>) are their text as it is
  const added = new Map(tokenizerJson.added_tokens.filter((t) => !t.special).map((t) => [t.id, t.content]));
  return (ids) => Buffer.from(ids.filter((id) => !special.has(id))
    .flatMap((id) => (added.has(id) ? [...Buffer.from(added.get(id), 'utf8')]
      : [...(symbol.get(id) ?? '')].map((ch) => byteOf.get(ch))))).toString('utf8'); // a padded id: nothing
}
