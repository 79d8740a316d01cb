// markdown.js - a model's answer as HTML: Markdown rendered by marked, then
// sanitized by DOMPurify. Model output is untrusted: HTML the model writes is
// shown as the text it is (never parsed as markup), images it names are shown
// as links (an image from elsewhere would break the page's CSP), and what
// marked makes passes DOMPurify before it reaches innerHTML.
import DOMPurify from 'dompurify';
import { Marked } from 'marked';

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const escapeHtml = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);

const marked = new Marked({
  gfm: true,
  async: false,
  renderer: {
    html({ text, block }) {
      return block ? `<p class="raw-html">${escapeHtml(text)}</p>` : escapeHtml(text);
    },
    image({ href, text }) {
      return `<a href="${escapeHtml(href)}">${escapeHtml(`image: ${text || href}`)}</a>`;
    },
  },
});

const PURIFY = {
  USE_PROFILES: { html: true },
  // style attributes break the CSP (style-src 'self'); forms and media have
  // no place in an answer
  FORBID_ATTR: ['style'],
  FORBID_TAGS: ['style', 'img', 'picture', 'video', 'audio', 'source', 'form', 'button', 'textarea', 'select'],
};

// Links in an answer open apart from the console and tell nothing of it.
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.hasAttribute('href')) {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
});

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text), PURIFY);
}
