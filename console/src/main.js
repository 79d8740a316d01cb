// main.js - the console's start: every part wired to the page, then, once
// the server has let the page in (a key where it asks for one), the server's
// health and the memory view's polling.
import { apiJson } from './api.js';
import { initAuth } from './auth.js';
import { initChat, setChatAvailable, showConversation, stopAnswer } from './chat.js';
import { initConversations } from './conversations.js';
import { watchHealth } from './health.js';
import { memoryViewShown, startMemory } from './memory.js';
import { initSettings } from './settings.js';
import { initViews } from './views.js';

const CHATLESS_TASKS = new Set(['embed', 'rerank']);

// Resolves once a key-protected call goes through: a 401 waits in the key
// dialog. Another failure (a 503 while the engine starts) is the server's
// to report elsewhere; the page goes on.
async function waitForAccess() {
  try {
    await apiJson('/v1/models');
  } catch {
    // not a 401: nothing to ask the user
  }
}

async function start() {
  initAuth();
  initSettings();
  initChat();
  initConversations({ show: showConversation, leave: stopAnswer });
  initViews((view) => {
    if (view === 'memory') memoryViewShown();
  });
  await waitForAccess();
  watchHealth((task) => setChatAvailable(!CHATLESS_TASKS.has(task)));
  startMemory();
}

start();
