// dom.js - building elements from script. Text goes in as text nodes, never as
// markup: the one place markup enters the page is markdown.js (sanitized).

// h('li', {className: 'x', dataset: {part: 'kv'}}, 'text', child) -> <li>.
// Props are element properties, except dataset (data-* attributes) and
// attrs (plain attributes, e.g. aria-*).
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (name === 'dataset') Object.assign(element.dataset, value);
    else if (name === 'attrs') for (const [a, v] of Object.entries(value)) element.setAttribute(a, v);
    else element[name] = value;
  }
  element.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return element;
}

export const byId = (id) => document.getElementById(id);
