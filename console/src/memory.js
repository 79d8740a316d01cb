// memory.js - the memory view, from /memory_stats and /metrics polled
// together (the next poll starts after the previous one ended: requests
// never pile up): each engine rank's device as one bar to scale, the visual
// worker's reservation as a bar of its own, the engine's start-up profile,
// the prefix cache's hit rate, request counters over the last five minutes,
// and what /metrics counts since start.
//
// Every number taken from /memory_stats is shown with its exact value in a
// data-* attribute (data-bytes on bar segments, data-value beside
// data-field elsewhere), as it was at the poll that drew it.
import { apiJson, apiText } from './api.js';
import { TimeSeries } from './charts.js';
import { byId, h } from './dom.js';
import { formatBytes, formatExactBytes, formatInt, formatPercent } from './format.js';
import { metricSum, parseMetrics } from './metrics.js';

const POLL_SHOWN_MS = 1000; // the view on screen
const POLL_HIDDEN_MS = 5000; // the chat on screen: the charts still get their history

// The parts of an engine's device, in bar order: [data-part, label, bytes].
// Free is what the device has beyond them all.
const PARTS = [
  ['weights', 'Weights', (m) => m.weights_bytes],
  ['kv-used', 'KV cache in use', (m, p) => p.kv_used_bytes],
  ['kv-free', 'KV cache free', (m, p) => m.kv_bytes - p.kv_used_bytes],
  ['visual', "Visual worker's reservation", (m) => m.peer_bytes],
  ['workspace', 'Workspace', (m) => m.workspace_bytes],
  ['state-pool', 'State pool', (m) => m.state_pool_bytes],
  ['canary', 'Canary', (m) => m.canary_bytes],
];

// The auto-profile's phases (docs/MEMORY.md, section 2) and their numbers:
// [memory key, label, kind].
const PROFILE = [
  ['Probe', 'a small KV cache, its peak measured', [
    ['probe_tokens', 'KV tokens', 'tokens'],
    ['probe_kv_bytes', 'KV bytes', 'bytes'],
    ['probe_peak_bytes', 'peak', 'bytes'],
    ['probe_driver_used_bytes', 'driver-seen use', 'bytes'],
  ]],
  ['Target', 'the budget left for KV', [
    ['non_kv_peak_bytes', 'non-KV peak', 'bytes'],
    ['target_budget_bytes', 'budget', 'bytes'],
    ['target_tokens', 'tokens', 'tokens'],
  ]],
  ['Rebuild and validate', 'the engine at the target, stressed', [
    ['attempts', 'attempts (at most 4)', 'count'],
    ['stress', 'stress', 'text'],
  ]],
  ['Result', 'held for good', [
    ['kv_capacity_tokens', 'KV capacity', 'tokens'],
    ['kv_bytes', 'KV bytes', 'bytes'],
    ['max_model_len', 'max model length', 'tokens'],
  ]],
];

const isNumber = (v) => typeof v === 'number' && Number.isFinite(v);
// a number /memory_stats left out (a process still starting) counts as 0
const orZero = (v) => (isNumber(v) ? v : 0);

// The processes that hold a device's memory map (llm, llm-1, ...).
const engines = (stats) => Object.entries(stats)
  .filter(([, p]) => isNumber(p?.memory?.device_total_bytes));
// One process per engine (its rank 0): counters that every rank repeats count once.
const engineLeaders = (stats) => engines(stats).filter(([, p]) => !p.engine_rank);

function sumCounter(processes, counter) {
  let sum = 0;
  for (const [, p] of processes) sum += orZero(p.counters?.[counter]);
  return sum;
}

/* ---- the devices ----------------------------------------------------------- */

function describeBytes(bytes) {
  return `${formatBytes(bytes)} (${formatExactBytes(bytes)})`;
}

function segment(part, label, bytes, total) {
  const element = h('div', {
    className: 'segment',
    dataset: { part, bytes: String(bytes) },
    title: `${label}: ${describeBytes(bytes)}`,
  });
  element.style.setProperty('--share', String(total > 0 ? Math.max(0, bytes) / total : 0));
  return element;
}

function legend(parts) {
  return h('ul', { className: 'legend' }, parts.map(([part, label, bytes]) => h('li', {},
    h('span', { className: 'swatch', dataset: { part } }),
    h('span', { className: 'legend-label', textContent: label }),
    h('span', { className: 'human', textContent: formatBytes(bytes) }),
    h('span', { className: 'exact', textContent: formatExactBytes(bytes) }))));
}

function fact(label, field, value, text) {
  return h('div', {},
    h('dt', { textContent: label }),
    h('dd', { dataset: { field, value: String(value) }, textContent: text }));
}

function engineDevice(name, process) {
  const m = process.memory;
  const total = m.device_total_bytes;
  const p = { ...process, kv_used_bytes: orZero(process.kv_used_bytes) };
  const parts = PARTS
    .map(([part, label, of]) => [part, label, orZero(of(m, p))])
    .filter(([part, , bytes]) => part !== 'state-pool' || bytes > 0);
  const used = parts.reduce((sum, [, , bytes]) => sum + bytes, 0);
  parts.push(['free', 'Free', Math.max(0, total - used)]);
  const facts = [];
  const add = (label, field, value, text) => {
    if (value !== undefined && value !== null) facts.push(fact(label, field, value, text));
  };
  add('KV capacity', 'kv_capacity_tokens', process.kv_capacity_tokens, `${formatInt(process.kv_capacity_tokens)} tokens`);
  add('KV in use', 'kv_used_tokens', process.kv_used_tokens, `${formatInt(process.kv_used_tokens)} tokens`);
  add('KV bytes a token', 'kv_bytes_per_token', m.kv_bytes_per_token, `${formatInt(m.kv_bytes_per_token)} bytes`);
  add('Max model length', 'max_model_len', m.max_model_len, `${formatInt(m.max_model_len)} tokens`);
  add('Weights format', 'weights_format', m.weights_format, m.weights_format);
  add('KV cache type', 'kv_dtype', m.kv_dtype, m.kv_dtype);
  const rank = isNumber(process.engine) ? ` · engine ${process.engine}, rank ${process.engine_rank ?? 0}` : '';
  return h('section', { className: 'device', dataset: { process: name } },
    h('h3', {}, h('span', { className: 'process-name', textContent: name }),
      h('span', { className: 'device-name', textContent: ` ${process.device || 'device'}${rank}` }),
      h('span', { className: 'device-total', dataset: { field: 'device_total_bytes', value: String(total) }, textContent: ` · ${describeBytes(total)}` })),
    h('div', {
      className: 'bar',
      attrs: { role: 'img', 'aria-label': parts.map(([, label, bytes]) => `${label} ${formatBytes(bytes)}`).join(', ') },
    }, parts.map(([part, label, bytes]) => segment(part, label, bytes, total))),
    legend(parts),
    h('dl', { className: 'facts' }, facts));
}

// The visual worker's reservation, to the scale of its device when an
// engine shares that device and reports its size.
function visualDevice(name, process, stats) {
  const bytes = process.reserved_bytes;
  const sharing = engines(stats).find(([, p]) => p.device && p.device === process.device);
  const total = sharing ? sharing[1].memory.device_total_bytes : bytes;
  const parts = [['visual', 'Reserved by the visual worker', bytes]];
  return h('section', { className: 'device visual-device', dataset: { process: name } },
    h('h3', {}, h('span', { className: 'process-name', textContent: name }),
      h('span', { className: 'device-name', textContent: ` ${process.device || 'device'}` }),
      h('span', { className: 'device-total', textContent: sharing ? ` · to the scale of ${sharing[0]}'s device` : '' })),
    h('div', { className: 'bar', attrs: { role: 'img', 'aria-label': `reserved ${formatBytes(bytes)}` } },
      segment('visual', parts[0][1], bytes, total)),
    legend(parts));
}

function renderDevices(stats) {
  // the engines' devices first (llm, llm-1, ...), then the visual worker's
  const devices = engines(stats).map(([name, process]) => engineDevice(name, process));
  for (const [name, process] of Object.entries(stats)) {
    if (name.startsWith('visual') && isNumber(process?.reserved_bytes) && process.memory
        && Object.keys(process.memory).length) devices.push(visualDevice(name, process, stats));
  }
  byId('memory-devices').replaceChildren(...(devices.length ? devices
    : [h('p', { className: 'empty', textContent: 'No process reports its device memory yet (starting?).' })]));
}

/* ---- the profile, the prefix cache ------------------------------------------ */

function profileValue(value, kind) {
  if (kind === 'bytes') return describeBytes(value);
  if (kind === 'tokens') return `${formatInt(value)} tokens`;
  return String(value);
}

function renderProfile(stats) {
  const [name, process] = engines(stats).find(([n]) => n === 'llm') ?? engines(stats)[0] ?? [];
  const timeline = byId('profile-timeline');
  if (!process) {
    timeline.replaceChildren();
    return;
  }
  const m = process.memory;
  timeline.dataset.process = name;
  timeline.replaceChildren(...PROFILE.map(([phase, what, fields]) => h('li', { className: 'phase' },
    h('h3', { textContent: phase }),
    h('p', { className: 'phase-what', textContent: what }),
    h('dl', {}, fields.filter(([key]) => m[key] !== undefined).map(([key, label, kind]) => h('div', {},
      h('dt', { textContent: label }),
      h('dd', { dataset: { field: key, value: String(m[key]) }, textContent: profileValue(m[key], kind) })))))));
}

function renderPrefixCache(stats) {
  const leaders = engineLeaders(stats);
  const hit = sumCounter(leaders, 'prefix_cache_hit_tokens_total');
  const query = sumCounter(leaders, 'prefix_cache_query_tokens_total');
  const element = byId('prefix-hit-rate');
  element.dataset.value = `${hit}/${query}`;
  element.textContent = query > 0
    ? `${formatPercent(hit, query)} · ${formatInt(hit)} of ${formatInt(query)} prompt tokens came from the cache`
    : 'no prompt tokens looked up yet';
}

/* ---- counters over time ------------------------------------------------------ */

const REFUSALS = ['rejected_queue_full_total', 'rejected_too_large_total', 'rejected_session_limit_total'];

// [id, title, CSS colour, value at a poll]; now: {stats, tokensPerSecond}.
// All but the last are counts.
const SERIES = [
  ['queued', 'Queued requests', '--chart-queued', ({ stats }) => orZero(stats.router?.counters?.requests_queued)],
  ['running', 'Running requests', '--chart-running', ({ stats }) => sumCounter(engineLeaders(stats), 'running')],
  ['preemptions', 'Preemptions (total)', '--chart-preemptions',
    ({ stats }) => sumCounter(engineLeaders(stats), 'preemptions_total')],
  ['refused', 'Refused requests (total)', '--chart-refused',
    ({ stats }) => REFUSALS.reduce((sum, c) => sum + orZero(stats.router?.counters?.[c]), 0)],
  ['tokens', 'Generated tokens a second', '--chart-tokens', ({ tokensPerSecond }) => tokensPerSecond],
];

const charts = new Map(); // id -> {series, value}: the chart and its latest number
let previous = null; // the last poll's {time, tokens}, for the token rate

function initCharts() {
  const box = byId('memory-charts');
  for (const [id, title, color] of SERIES) {
    const value = h('span', { className: 'chart-value' });
    const plot = h('div', { className: 'chart-plot' });
    box.append(h('figure', { className: 'chart', dataset: { series: id } },
      h('figcaption', {}, h('span', { textContent: title }), value), plot));
    charts.set(id, { series: new TimeSeries(plot, color, { integer: id !== 'tokens' }), value });
  }
}

function recordSeries(stats, samples, time) {
  const tokens = metricSum(samples, 'vlmd_generation_tokens_total');
  const tokensPerSecond = previous && tokens !== null && previous.tokens !== null && time > previous.time
    ? Math.max(0, tokens - previous.tokens) / (time - previous.time) : null;
  previous = { time, tokens };
  for (const [id, , , of] of SERIES) {
    const value = of({ stats, tokensPerSecond });
    const chart = charts.get(id);
    chart.value.textContent = value === null ? '–' : Number.isInteger(value) ? formatInt(value) : value.toFixed(1);
    chart.series.push(time, value);
  }
}

function redrawCharts() {
  for (const { series } of charts.values()) series.draw();
}

/* ---- what /metrics counts ---------------------------------------------------- */

function renderRequestMetrics(samples) {
  const rows = [];
  const add = (label, name, value, text) => {
    if (value !== null) rows.push(h('div', {}, h('dt', { textContent: label }),
      h('dd', { dataset: { metric: name, metricValue: String(value) }, textContent: text })));
  };
  for (const reason of ['stop', 'length', 'cancelled', 'error']) {
    const n = metricSum(samples, 'vlmd_requests_finished_total', { finished_reason: reason });
    add(`Finished: ${reason}`, `vlmd_requests_finished_total{finished_reason="${reason}"}`, n, formatInt(n ?? 0));
  }
  const prompt = metricSum(samples, 'vlmd_prompt_tokens_total');
  add('Prompt tokens', 'vlmd_prompt_tokens_total', prompt, formatInt(prompt ?? 0));
  const generated = metricSum(samples, 'vlmd_generation_tokens_total');
  add('Generated tokens', 'vlmd_generation_tokens_total', generated, formatInt(generated ?? 0));
  for (const [label, base] of [['Mean time to first token', 'vlmd_time_to_first_token_seconds'],
    ['Mean time between tokens', 'vlmd_inter_token_latency_seconds'],
    ['Mean request time', 'vlmd_e2e_request_latency_seconds']]) {
    const sum = metricSum(samples, `${base}_sum`);
    const count = metricSum(samples, `${base}_count`);
    if (sum === null || count === null) continue;
    add(label, base, count > 0 ? sum / count : 0, count > 0 ? `${((1000 * sum) / count).toFixed(1)} ms` : '–');
  }
  byId('request-metrics').replaceChildren(...rows);
}

/* ---- polling ------------------------------------------------------------------ */

let timer = 0;
let inFlight = false;

const viewShown = () => !byId('view-memory').hidden;

async function poll() {
  timer = 0;
  if (inFlight) return;
  inFlight = true;
  const status = byId('memory-status');
  try {
    if (!document.hidden) {
      // /metrics is optional to the view: without it the rest still shows
      const [stats, metricsText] = await Promise.all([apiJson('/memory_stats'), apiText('/metrics').catch(() => '')]);
      const samples = parseMetrics(metricsText);
      renderDevices(stats);
      renderProfile(stats);
      renderPrefixCache(stats);
      recordSeries(stats, samples, Date.now() / 1000);
      renderRequestMetrics(samples);
      status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      status.classList.remove('failed');
    }
  } catch (e) {
    status.textContent = `Could not read the memory: ${e?.message ?? e}`;
    status.classList.add('failed');
  } finally {
    inFlight = false;
    timer = setTimeout(poll, viewShown() ? POLL_SHOWN_MS : POLL_HIDDEN_MS);
  }
}

// The view was shown: fresh numbers now rather than at the next slow tick.
export function memoryViewShown() {
  redrawCharts();
  if (timer && !inFlight) {
    clearTimeout(timer);
    poll();
  }
}

export function startMemory() {
  initCharts();
  let resizing = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizing);
    resizing = setTimeout(redrawCharts, 150);
  });
  poll();
}
