// conversations.js - the sidebar's list of conversations and which one is
// shown: new, open, rename (in place: Enter keeps, Escape goes back), delete.
// The current one is remembered, so a reload shows it again.
import { byId, h } from './dom.js';
import {
  deleteConversation, listConversations, loadConversation, loadCurrentId, newId,
  saveConversation, saveCurrentId,
} from './store.js';

const UNTITLED = 'New conversation';
const TITLE_LENGTH = 48;

let current = null;
let hooks = { show: () => {}, leave: () => {} };

function create() {
  return { id: newId(), title: UNTITLED, titled: false, created: Date.now(), messages: [] };
}

export const currentConversation = () => current;

// Stores a conversation (unless it was deleted meanwhile) and shows its
// title in the list; one not yet named by the user takes its first words.
export function saveConversationNow(conversation) {
  if (conversation.deleted) return;
  if (!conversation.titled) {
    const first = conversation.messages.find((m) => m.role === 'user');
    if (first) {
      const words = first.text.trim().replace(/\s+/g, ' ');
      conversation.title = words ? (words.length > TITLE_LENGTH ? `${words.slice(0, TITLE_LENGTH - 1)}…` : words) : 'Images';
    }
  }
  saveConversation(conversation);
  renderList();
}

function open(conversation) {
  if (current && current !== conversation) hooks.leave(current);
  current = conversation;
  saveCurrentId(conversation.id);
  renderList();
  hooks.show(conversation);
}

function openById(id) {
  const conversation = loadConversation(id);
  if (conversation) open(conversation);
  else {
    // its text did not fit in storage: it cannot be shown, so it goes
    deleteConversation(id);
    openFirstOrNew();
  }
}

function openNew() {
  const conversation = create();
  saveConversation(conversation);
  open(conversation);
}

function openFirstOrNew() {
  const first = listConversations()[0];
  if (first) openById(first.id);
  else openNew();
}

function remove(id) {
  if (current?.id === id) {
    hooks.leave(current);
    current.deleted = true;
    current = null;
  }
  deleteConversation(id);
  if (!current) openFirstOrNew();
  else renderList();
}

function rename(item, entry) {
  const input = h('input', {
    type: 'text',
    className: 'rename-input',
    value: entry.title,
    attrs: { 'aria-label': 'New name of the conversation' },
  });
  let finished = false;
  const finish = (keep) => {
    if (finished) return;
    finished = true;
    const title = input.value.trim();
    if (keep && title && title !== entry.title) {
      const conversation = current?.id === entry.id ? current : loadConversation(entry.id);
      if (conversation) {
        conversation.title = title;
        conversation.titled = true;
        saveConversation(conversation);
      }
    }
    renderList();
    byId('conversations').querySelector(`[data-id="${CSS.escape(entry.id)}"] .rename`)?.focus();
  };
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter') {
      event.preventDefault();
      finish(true);
    } else if (event.key === 'Escape') {
      event.preventDefault();
      finish(false);
    }
  });
  input.addEventListener('blur', () => finish(true));
  item.querySelector('.open').replaceWith(input);
  input.focus();
  input.select();
}

function renderList() {
  const list = listConversations();
  // one that storage could not take is still listed while it is shown
  if (current && !list.some((c) => c.id === current.id)) list.unshift({ id: current.id, title: current.title });
  const items = list.map((entry) => {
    const isCurrent = entry.id === current?.id;
    const item = h('li', { className: 'conversation', dataset: { id: entry.id } },
      h('button', {
        type: 'button',
        className: 'open',
        textContent: entry.title,
        title: entry.title,
        attrs: isCurrent ? { 'aria-current': 'true' } : {},
        onclick: () => { if (!isCurrent) openById(entry.id); },
      }),
      h('button', {
        type: 'button',
        className: 'rename',
        textContent: '✎',
        title: 'Rename',
        attrs: { 'aria-label': `Rename ${entry.title}` },
        onclick: () => rename(item, entry),
      }),
      h('button', {
        type: 'button',
        className: 'delete',
        textContent: '✕',
        title: 'Delete',
        attrs: { 'aria-label': `Delete ${entry.title}` },
        onclick: () => remove(entry.id),
      }));
    if (isCurrent) item.classList.add('current');
    return item;
  });
  byId('conversations').replaceChildren(...items);
}

// show(conversation): put it on screen; leave(conversation): it stops being
// shown (a request running for it is stopped).
export function initConversations({ show, leave }) {
  hooks = { show, leave };
  byId('new-conversation').addEventListener('click', () => {
    openNew();
    byId('prompt').focus();
  });
  const remembered = loadCurrentId();
  if (remembered && listConversations().some((c) => c.id === remembered)) openById(remembered);
  else openFirstOrNew();
}
