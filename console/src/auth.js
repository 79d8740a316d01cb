// auth.js - the API key. Kept for the tab (sessionStorage), sent by api.js as
// a Bearer header. When the server answers 401, the key dialog opens with the
// server's message and the page behind it is hidden: before a key is known
// the page shows nothing from the server. A key is taken only once the
// server accepts it (GET /v1/models), then every call that waited for it
// goes again.
import { byId } from './dom.js';

const KEY_STORAGE = 'vlmd.console.key';
const CHECK_PATH = '/v1/models';

let key = readStoredKey();
let waiting = null; // {promise, resolve} while the dialog is open

function readStoredKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE) || '';
  } catch {
    return '';
  }
}

function storeKey(value) {
  try {
    sessionStorage.setItem(KEY_STORAGE, value);
  } catch {
    // storage switched off: the key lasts as long as the page
  }
}

export const currentKey = () => key;

export const authorization = (value) => (value ? { Authorization: `Bearer ${value}` } : {});

// The server's message from an error answer ({"error": {"message"}}), else
// its status and the start of its body.
export async function errorMessage(response) {
  let text = '';
  try {
    text = await response.text();
  } catch {
    // the body broke off: the status is all there is
  }
  try {
    const message = JSON.parse(text)?.error?.message;
    if (typeof message === 'string' && message) return message;
  } catch {
    // not JSON: said below as it is
  }
  const status = `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`;
  return text ? `${status}: ${text.slice(0, 300)}` : status;
}

function setLocked(locked) {
  byId('app').hidden = locked;
}

function openDialog(message) {
  const dialog = byId('key-dialog');
  byId('key-error').textContent = message;
  byId('key-input').value = '';
  setLocked(true);
  if (!dialog.open) dialog.showModal();
  byId('key-input').focus();
}

// Resolves once the user has given a key the server takes. message: the
// server's 401 message. signal: a caller that gives up (its AbortController)
// stops waiting, with an AbortError, while the dialog stays for the others.
export function requestKey(message, signal) {
  if (!waiting) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    waiting = { promise, resolve };
    openDialog(message);
  }
  if (!signal) return waiting.promise;
  return new Promise((resolve, reject) => {
    const abort = () => reject(new DOMException('the request was stopped', 'AbortError'));
    if (signal.aborted) abort();
    signal.addEventListener('abort', abort, { once: true });
    waiting.promise.then(resolve);
  });
}

async function submitKey() {
  const input = byId('key-input');
  const error = byId('key-error');
  const submit = byId('key-submit');
  const candidate = input.value.trim();
  error.textContent = '';
  submit.disabled = true;
  try {
    const response = await fetch(CHECK_PATH, { headers: authorization(candidate), cache: 'no-store' });
    if (response.status === 401) {
      error.textContent = await errorMessage(response);
      input.select();
      return;
    }
    key = candidate;
    storeKey(candidate);
    byId('key-dialog').close();
    setLocked(false);
    const { resolve } = waiting ?? {};
    waiting = null;
    resolve?.();
  } catch (e) {
    error.textContent = `Cannot reach the server: ${e.message}`;
  } finally {
    submit.disabled = false;
  }
}

export function initAuth() {
  const dialog = byId('key-dialog');
  // the form only gathers the key: its submission never leaves the page
  byId('key-form').addEventListener('submit', (event) => {
    event.preventDefault();
    submitKey();
  });
  // Escape would leave a page that can do nothing without a key (and where
  // the browser closes it anyway, it opens again)
  dialog.addEventListener('cancel', (event) => event.preventDefault());
  dialog.addEventListener('close', () => {
    if (waiting) dialog.showModal();
  });
}
