// build.mjs - bundles the console (src/) for vlmd to embed:
//
//   node build.mjs [OUT_DIR]      (default: dist/, replaced whole)
//
// OUT_DIR gets index.html (from src/index.html, its %APP_JS%, %APP_CSS% and
// %LICENSES% filled in), app.<hash>.js (src/main.js and its modules,
// minified, ES2020), app.<hash>.css (src/style.css with uPlot's sheet) and
// licenses.<hash>.txt (the license of every package in the bundle). <hash>
// is the first 16 hex digits of the file's SHA-256, so a name changes with
// its content and the server may cache it for good. The server serves
// index.html at / and every other file at /console/<name>. A given OUT_DIR
// must be absent or empty: nothing is deleted but the default dist/.
// Runs offline once `npm ci` has installed esbuild.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = path.dirname(fileURLToPath(import.meta.url));
const src = path.join(here, 'src');
const defaultOut = path.join(here, 'dist');
const outDir = path.resolve(process.argv[2] ?? defaultOut);

function fail(message) {
  console.error(`build.mjs: ${message}`);
  process.exit(1);
}

const hashOf = (bytes) => createHash('sha256').update(bytes).digest('hex').slice(0, 16);

// Bundles one entry point; returns its bytes (the only output: no source
// maps, no split chunks) and the files it was made from.
async function bundle(entry, extra = {}) {
  const result = await esbuild.build({
    entryPoints: [path.join(src, entry)],
    bundle: true,
    minify: true,
    target: 'es2020',
    platform: 'browser',
    // the packages' license notices stay, at the end of the file
    legalComments: 'eof',
    outdir: path.join(here, '.out'), // names the outputs only: write is false
    write: false,
    metafile: true,
    logLevel: 'warning',
    ...extra,
  });
  if (result.outputFiles.length !== 1) fail(`${entry} made ${result.outputFiles.length} files, not one`);
  return { bytes: result.outputFiles[0].contents, inputs: Object.keys(result.metafile.inputs) };
}

// The license text of every package a bundle took files from, in name order.
function licensesOf(inputs) {
  const roots = new Set();
  for (const input of inputs) {
    const m = /^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(input.replaceAll('\\', '/'));
    if (m) roots.add(path.resolve(here, m[1]));
  }
  const texts = [];
  for (const root of [...roots].sort()) {
    const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'));
    const file = readdirSync(root).find((f) => /^(licen[cs]e|copying)(\.|$)/i.test(f));
    if (!file) fail(`${pkg.name} ships no license file`);
    texts.push(`${pkg.name} ${pkg.version} (${pkg.license ?? 'see below'})\n${'='.repeat(60)}\n\n`
      + `${readFileSync(path.join(root, file), 'utf8').trim()}\n`);
  }
  return `Third-party software in vlmd's console, bundled into its script and style sheet.\n\n${texts.join('\n\n')}`;
}

const js = await bundle('main.js', { format: 'esm' });
const css = await bundle('style.css');
const licenses = Buffer.from(licensesOf([...js.inputs, ...css.inputs]));

const files = new Map(); // name -> bytes
const add = (stem, ext, bytes) => {
  const name = `${stem}.${hashOf(bytes)}.${ext}`;
  files.set(name, bytes);
  return `/console/${name}`;
};
const urls = {
  '%APP_JS%': add('app', 'js', js.bytes),
  '%APP_CSS%': add('app', 'css', css.bytes),
  '%LICENSES%': add('licenses', 'txt', licenses),
};

let html = readFileSync(path.join(src, 'index.html'), 'utf8');
for (const [placeholder, url] of Object.entries(urls)) {
  if (!html.includes(placeholder)) fail(`src/index.html has no ${placeholder}`);
  html = html.replaceAll(placeholder, url);
}
files.set('index.html', Buffer.from(html));

if (outDir === defaultOut) rmSync(outDir, { recursive: true, force: true });
else if (existsSync(outDir) && readdirSync(outDir).length) fail(`${outDir} is not empty`);
mkdirSync(outDir, { recursive: true });
let total = 0;
for (const [name, bytes] of files) {
  writeFileSync(path.join(outDir, name), bytes);
  total += bytes.length;
  console.log(`build.mjs: ${path.join(outDir, name)} (${bytes.length} bytes)`);
}
console.log(`build.mjs: ${files.size} files, ${total} bytes`);
