// metrics.js - reading /metrics (Prometheus' text format) into samples, and
// sums over them by name and labels.

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

function parseValue(text) {
  if (text === '+Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  return Number(text); // NaN stays NaN
}

// [{name, labels: {label: value}, value}] of every sample line; comments
// and lines that are not samples are skipped.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = SAMPLE.exec(line);
    if (!match) continue;
    const labels = {};
    for (const [, label, value] of (match[2] ?? '').matchAll(LABEL)) labels[label] = value.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    samples.push({ name: match[1], labels, value: parseValue(match[3]) });
  }
  return samples;
}

// The sum of the samples named name whose labels include every one of
// wanted; null when there is none.
export function metricSum(samples, name, wanted = {}) {
  let sum = null;
  for (const s of samples) {
    if (s.name !== name || Object.entries(wanted).some(([k, v]) => s.labels[k] !== v)) continue;
    sum = (sum ?? 0) + s.value;
  }
  return sum;
}
