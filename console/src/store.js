// store.js - what the console keeps in the browser's localStorage, every key
// under "vlmd.console.": the settings, the list of conversations, each
// conversation's text, and each image under a key of its own. Images are what
// fills the storage: when a write does not fit, the oldest image is dropped and
// the write tried again, so text is never lost to an image. Nothing here
// throws: storage that is full or switched off means the page keeps working
// with what it has in memory.

const PREFIX = 'vlmd.console.';
const SETTINGS_KEY = `${PREFIX}settings`;
const INDEX_KEY = `${PREFIX}conversations`;
const CURRENT_KEY = `${PREFIX}current`;
const CONVERSATION_PREFIX = `${PREFIX}conversation.`;
const IMAGE_PREFIX = `${PREFIX}image.`;

function read(key) {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}

function readJson(key, fallback) {
  const text = read(key);
  if (text === null) return fallback;
  try {
    return JSON.parse(text);
  } catch {
    return fallback;
  }
}

function remove(key) {
  try {
    localStorage.removeItem(key);
  } catch {
    // storage switched off: there is nothing to remove
  }
}

const isQuotaError = (e) => e instanceof DOMException
  && (e.name === 'QuotaExceededError' || e.name === 'NS_ERROR_DOM_QUOTA_REACHED' || e.code === 22);

// The time an image was stored, from its id ("<ms>-<random>").
const imageTime = (key) => Number(key.slice(IMAGE_PREFIX.length).split('-')[0]) || 0;

// Drops the oldest stored image other than keep; false when there is none.
function dropOldestImage(keep) {
  let oldest = null;
  try {
    for (let i = 0; i < localStorage.length; i++) {
      const key = localStorage.key(i);
      if (key && key.startsWith(IMAGE_PREFIX) && key !== keep
          && (oldest === null || imageTime(key) < imageTime(oldest))) oldest = key;
    }
  } catch {
    return false;
  }
  if (oldest === null) return false;
  remove(oldest);
  return true;
}

// Writes key; a full storage gives up its oldest images until the value fits.
// False when it cannot be stored (no image left to drop, storage off).
function write(key, value) {
  for (;;) {
    try {
      localStorage.setItem(key, value);
      return true;
    } catch (e) {
      if (!isQuotaError(e) || !dropOldestImage(key)) return false;
    }
  }
}

/* ---- settings ------------------------------------------------------------ */

export const loadSettings = () => readJson(SETTINGS_KEY, {});
export const saveSettings = (settings) => write(SETTINGS_KEY, JSON.stringify(settings));

/* ---- conversations ------------------------------------------------------- */

// A conversation: {id, title, titled (the user named it), created, messages}.
// A message: {role: 'user', text, images: [{id, url}]} or {role: 'assistant',
// content, reasoning, toolCalls: [{name, arguments}], stats, stopped, error}.
// An image whose url is null was dropped from storage.

export const newId = () => `${Date.now()}-${Math.random().toString(36).slice(2, 8)}`;

// [{id, title}], newest first.
export function listConversations() {
  const list = readJson(INDEX_KEY, []);
  return Array.isArray(list) ? list.filter((c) => c && typeof c.id === 'string') : [];
}

function saveIndex(list) {
  write(INDEX_KEY, JSON.stringify(list.map(({ id, title }) => ({ id, title }))));
}

export function loadConversation(id) {
  const stored = readJson(CONVERSATION_PREFIX + id, null);
  if (!stored || !Array.isArray(stored.messages)) return null;
  for (const m of stored.messages) {
    if (m.role !== 'user') continue;
    m.images = (m.images ?? []).map(({ id: imageId }) => {
      const url = read(IMAGE_PREFIX + imageId);
      return { id: imageId, url, stored: url !== null };
    });
  }
  return stored;
}

// Stores the conversation (its images first, each once) and puts it in the list.
export function saveConversation(conversation) {
  for (const m of conversation.messages) {
    for (const image of m.role === 'user' ? m.images : []) {
      if (image.url && !image.stored) image.stored = write(IMAGE_PREFIX + image.id, image.url);
    }
  }
  const text = JSON.stringify(conversation, (key, value) => {
    if (key === 'images') return value.map(({ id }) => ({ id }));
    return value;
  });
  write(CONVERSATION_PREFIX + conversation.id, text);
  // a new conversation goes first; a known one keeps its place
  const list = listConversations();
  const entry = { id: conversation.id, title: conversation.title };
  const at = list.findIndex((c) => c.id === conversation.id);
  if (at < 0) list.unshift(entry);
  else list[at] = entry;
  saveIndex(list);
}

export function deleteConversation(id) {
  const stored = readJson(CONVERSATION_PREFIX + id, null);
  for (const m of stored?.messages ?? []) for (const image of m.images ?? []) remove(IMAGE_PREFIX + image.id);
  remove(CONVERSATION_PREFIX + id);
  saveIndex(listConversations().filter((c) => c.id !== id));
}

export const loadCurrentId = () => read(CURRENT_KEY);
export const saveCurrentId = (id) => write(CURRENT_KEY, id);
