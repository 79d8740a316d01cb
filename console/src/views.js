// views.js - the two views, chat and memory: one shown at a time (the other
// has the hidden attribute), switched by the header's buttons; the URL's
// fragment (#memory) keeps the choice across a reload.
import { byId } from './dom.js';

const VIEWS = { chat: ['nav-chat', 'view-chat'], memory: ['nav-memory', 'view-memory'] };

let onShow = () => {};

function show(name) {
  for (const [view, [nav, section]] of Object.entries(VIEWS)) {
    byId(section).hidden = view !== name;
    byId(nav).setAttribute('aria-pressed', String(view === name));
  }
  const fragment = name === 'chat' ? '' : `#${name}`;
  if (location.hash !== fragment) history.replaceState(null, '', `${location.pathname}${location.search}${fragment}`);
  onShow(name);
}

// shown(name): called each time a view is shown.
export function initViews(shown) {
  onShow = shown;
  for (const [view, [nav]] of Object.entries(VIEWS)) byId(nav).addEventListener('click', () => show(view));
  show(location.hash === '#memory' ? 'memory' : 'chat');
}
