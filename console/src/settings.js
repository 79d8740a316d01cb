// settings.js - the generation settings at hand beside the chat (system
// prompt, temperature, top_p, max tokens, seed, thinking), kept in
// localStorage, and the request fields they make. A number field left empty
// is left out of the request: the server's default applies.
import { byId } from './dom.js';
import { loadSettings, saveSettings } from './store.js';

// input id -> [request field, default shown in a fresh console]
const NUMBER_FIELDS = {
  'temperature': ['temperature', '0.7'],
  'top-p': ['top_p', '1'],
  'max-tokens': ['max_tokens', '1024'],
  'seed': ['seed', ''],
};

function save() {
  const settings = { systemPrompt: byId('system-prompt').value, thinking: byId('thinking').checked };
  for (const id of Object.keys(NUMBER_FIELDS)) settings[id] = byId(id).value;
  saveSettings(settings);
}

export function initSettings() {
  const stored = loadSettings();
  byId('system-prompt').value = typeof stored.systemPrompt === 'string' ? stored.systemPrompt : '';
  byId('thinking').checked = stored.thinking === true;
  for (const [id, [, fallback]] of Object.entries(NUMBER_FIELDS))
    byId(id).value = typeof stored[id] === 'string' ? stored[id] : fallback;
  for (const id of ['system-prompt', 'thinking', ...Object.keys(NUMBER_FIELDS)]) {
    byId(id).addEventListener('input', save);
    byId(id).addEventListener('change', save);
  }
}

// The system prompt as typed; '' when blank (then no system turn is sent).
export function systemPrompt() {
  const text = byId('system-prompt').value;
  return text.trim() ? text : '';
}

// The request's sampling fields as the panel says now.
export function requestSettings() {
  const fields = { chat_template_kwargs: { enable_thinking: byId('thinking').checked } };
  for (const [id, [name]] of Object.entries(NUMBER_FIELDS)) {
    const text = byId(id).value.trim();
    if (text !== '' && Number.isFinite(Number(text))) fields[name] = Number(text);
  }
  return fields;
}
