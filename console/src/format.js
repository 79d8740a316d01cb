// format.js - numbers for people: bytes in binary units beside their exact
// count, integers with separators, rates.

const UNITS = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB'];

// 2824704 -> "2.69 MiB"; below 1 KiB the bytes themselves.
export function formatBytes(bytes) {
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  if (unit === 0) return `${bytes} ${bytes === 1 ? 'byte' : 'bytes'}`;
  return `${value.toFixed(value >= 100 ? 0 : value >= 10 ? 1 : 2)} ${UNITS[unit]}`;
}

const grouped = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

// 18625717248 -> "18,625,717,248"
export const formatInt = (n) => grouped.format(n);

export const formatExactBytes = (bytes) => `${formatInt(bytes)} bytes`;

// The share of a whole as a percentage with one decimal, "-" with no whole.
export const formatPercent = (part, whole) => (whole > 0 ? `${((100 * part) / whole).toFixed(1)} %` : '–');
