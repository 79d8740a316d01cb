// chat.js - the chat view: the conversation's messages, the composer (prompt,
// images, send, stop) and one streamed answer at a time. An answer is
// rendered as it streams: its content as sanitized Markdown, its reasoning
// and tool calls as text; when it ends (or is stopped) it gets its token
// count and speed and data-done="true". A request the server refuses before
// answering goes back to the composer with the server's message in #error.
import { ApiError } from './api.js';
import { initAttachments, restoreAttachments, takeAttachments } from './attachments.js';
import { currentConversation, saveConversationNow } from './conversations.js';
import { byId, h } from './dom.js';
import { renderMarkdown } from './markdown.js';
import { requestSettings, systemPrompt } from './settings.js';
import { streamChatCompletion } from './stream.js';

let running = null; // {controller, conversation} from send until the answer ends
let chatAvailable = true;

export const showError = (message) => { byId('error').textContent = message; };

/* ---- the request ----------------------------------------------------------- */

// The conversation as the API's messages: the system prompt first when there
// is one; images as image_url parts (data: URIs) before the text part.
function buildMessages(history) {
  const system = systemPrompt();
  const messages = system ? [{ role: 'system', content: system }] : [];
  for (const m of history) {
    if (m.role === 'user') {
      const images = m.images.filter((image) => image.url);
      if (images.length === 0) {
        messages.push({ role: 'user', content: m.text });
        continue;
      }
      const parts = images.map((image) => ({ type: 'image_url', image_url: { url: image.url } }));
      if (m.text.trim()) parts.push({ type: 'text', text: m.text });
      messages.push({ role: 'user', content: parts });
    } else {
      const turn = { role: 'assistant', content: m.content };
      if (m.reasoning) turn.reasoning_content = m.reasoning;
      messages.push(turn);
    }
  }
  return messages;
}

// One chunk of the stream into the answer. timing: when the first and last
// token came and how many chunks carried one (the server sends one a token).
function applyChunk(answer, chunk, timing) {
  const choice = chunk.choices?.find((c) => (c.index ?? 0) === 0);
  if (choice) {
    const delta = choice.delta ?? {};
    let token = false;
    if (typeof delta.content === 'string') {
      answer.content += delta.content;
      token = true;
    }
    if (typeof delta.reasoning_content === 'string') {
      answer.reasoning += delta.reasoning_content;
      token = true;
    }
    for (const piece of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
      const call = (answer.toolCalls[piece.index ?? 0] ??= { name: '', arguments: '' });
      if (typeof piece.function?.name === 'string') call.name += piece.function.name;
      if (typeof piece.function?.arguments === 'string') call.arguments += piece.function.arguments;
      token = true;
    }
    if (token) {
      const now = performance.now();
      timing.first ??= now;
      timing.last = now;
      timing.chunks++;
    }
    if (choice.finish_reason) answer.finishReason = choice.finish_reason;
  }
  if (chunk.usage) answer.usage = chunk.usage;
}

// What the stats line says: the usage's tokens when it came (else the chunks
// counted), per second from the first token to the last.
function answerStats(answer, timing) {
  const usage = answer.usage;
  const tokens = usage?.completion_tokens ?? timing.chunks;
  const seconds = timing.first === null ? 0 : (timing.last - timing.first) / 1000;
  return {
    tokens,
    counted: !usage, // no usage (stopped, failed): the tokens are the chunks seen
    // tokens that came in one burst (one read) give no rate worth showing
    tokensPerSecond: seconds >= 0.001 ? tokens / seconds : null,
    promptTokens: usage?.prompt_tokens ?? null,
    cachedTokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
  };
}

/* ---- the messages on screen ----------------------------------------------- */

const messagesBox = () => byId('messages');
const nearEnd = (box) => box.scrollHeight - box.scrollTop - box.clientHeight < 64;

function userView(message) {
  const images = message.images.map((image) => (image.url
    ? h('img', { src: image.url, alt: 'image sent with this message' })
    : h('span', { className: 'image-dropped', textContent: 'image no longer kept in this browser' })));
  return h('article', { className: 'message user' },
    images.length ? h('div', { className: 'images' }, images) : null,
    h('div', { className: 'content', textContent: message.text }));
}

function callView(call) {
  return h('div', { className: 'tool-call' },
    h('span', { className: 'tool-name', textContent: call.name || '(unnamed call)' }),
    h('pre', { className: 'tool-arguments', textContent: call.arguments }));
}

function statsLine(answer) {
  const s = answer.stats;
  const parts = [];
  if (s) {
    parts.push(`${s.counted ? '~' : ''}${s.tokens} tokens`);
    if (s.tokensPerSecond !== null) parts.push(`${s.tokensPerSecond.toFixed(1)} tok/s`);
  }
  if (answer.finishReason === 'length') parts.push('cut at max tokens');
  if (answer.stopped) parts.push('stopped');
  if (answer.error) parts.push('failed');
  return parts.join(' · ');
}

function statsTitle(answer) {
  const s = answer.stats;
  if (!s || s.promptTokens === null) return '';
  return `prompt: ${s.promptTokens} tokens${s.cachedTokens ? `, ${s.cachedTokens} of them from the prefix cache` : ''}`;
}

// An assistant message's element and how to redraw it: update() at the next
// frame (tokens come faster than frames), finish() at once.
function assistantView(answer) {
  const content = h('div', { className: 'content' });
  const stats = h('p', { className: 'stats' });
  const element = h('article', { className: 'message assistant' }, content, stats);
  let reasoningText = null;
  let calls = null;
  let frame = 0;

  function render() {
    frame = 0;
    const box = messagesBox();
    const stick = element.isConnected && nearEnd(box);
    if (answer.reasoning && !reasoningText) {
      reasoningText = h('div', { className: 'reasoning-text' });
      element.prepend(h('details', { className: 'reasoning' }, h('summary', { textContent: 'Reasoning' }), reasoningText));
    }
    if (reasoningText) reasoningText.textContent = answer.reasoning;
    content.innerHTML = renderMarkdown(answer.content);
    if (answer.toolCalls.length) {
      if (!calls) stats.before((calls = h('div', { className: 'tool-calls' })));
      calls.replaceChildren(...answer.toolCalls.filter(Boolean).map(callView));
    }
    stats.textContent = statsLine(answer);
    stats.title = statsTitle(answer);
    if (stick) box.scrollTop = box.scrollHeight;
  }

  return {
    element,
    update() {
      element.classList.add('streaming');
      if (!frame) frame = requestAnimationFrame(render);
    },
    finish() {
      if (frame) cancelAnimationFrame(frame);
      element.classList.remove('streaming');
      render();
      element.dataset.done = 'true';
    },
  };
}

export function showConversation(conversation) {
  showError('');
  const views = conversation.messages.map((m) => {
    if (m.role === 'user') return userView(m);
    const view = assistantView(m);
    view.finish();
    return view.element;
  });
  const box = messagesBox();
  box.replaceChildren(...views);
  box.scrollTop = box.scrollHeight;
}

/* ---- sending and stopping -------------------------------------------------- */

function setRunning(on) {
  const hadFocus = document.activeElement;
  byId('send').disabled = on || !chatAvailable;
  byId('stop').disabled = !on;
  // a button that gets disabled drops the focus: it goes back to the prompt
  if (hadFocus && hadFocus.disabled) byId('prompt').focus();
}

async function send() {
  if (running || !chatAvailable) return;
  running = { controller: new AbortController(), conversation: currentConversation() };
  const prompt = byId('prompt');
  const images = await takeAttachments();
  const text = prompt.value;
  if (!text.trim() && images.length === 0) {
    running = null;
    return;
  }
  const { controller, conversation } = running;
  prompt.value = '';
  showError('');
  setRunning(true);

  const user = { role: 'user', text, images: images.map(({ id, url }) => ({ id, url })) };
  const answer = { role: 'assistant', content: '', reasoning: '', toolCalls: [], stats: null };
  const history = [...conversation.messages, user];
  conversation.messages.push(user, answer);
  const userElement = userView(user);
  const view = assistantView(answer);
  view.update();
  messagesBox().append(userElement, view.element);
  messagesBox().scrollTop = messagesBox().scrollHeight;
  saveConversationNow(conversation);

  const timing = { first: null, last: null, chunks: 0 };
  let answering = false;
  try {
    await streamChatCompletion({ messages: buildMessages(history), ...requestSettings() }, {
      signal: controller.signal,
      onOpen: () => { answering = true; },
      onChunk: (chunk) => {
        applyChunk(answer, chunk, timing);
        view.update();
      },
    });
  } catch (e) {
    if (e?.name === 'AbortError') {
      answer.stopped = true;
    } else if (!answering) {
      // refused before any answer (or no server): the turn goes back to the
      // composer, to be changed and sent again
      conversation.messages.splice(conversation.messages.indexOf(user), 2);
      userElement.remove();
      view.element.remove();
      if (!prompt.value) prompt.value = text;
      restoreAttachments(images);
      showError(e instanceof ApiError ? e.message : `Cannot reach the server: ${e?.message ?? e}`);
    } else {
      answer.error = e?.message ?? String(e);
      showError(answer.error);
    }
  } finally {
    answer.stats = answerStats(answer, timing);
    view.finish();
    running = null;
    setRunning(false);
    saveConversationNow(conversation);
  }
}

// Stops the answer streaming for conversation (any, when not given).
export function stopAnswer(conversation) {
  if (running && (!conversation || running.conversation === conversation)) running.controller.abort();
}

// available false (an embedding or reranking model): nothing can be sent.
export function setChatAvailable(available) {
  chatAvailable = available;
  byId('prompt').disabled = !available;
  setRunning(Boolean(running));
}

export function initChat() {
  const prompt = byId('prompt');
  prompt.addEventListener('keydown', (event) => {
    // Enter sends; Shift+Enter is a new line; Enter that ends an IME composition is neither
    if (event.key !== 'Enter' || event.shiftKey || event.isComposing || event.keyCode === 229) return;
    event.preventDefault();
    send();
  });
  byId('send').addEventListener('click', () => send());
  byId('stop').addEventListener('click', () => stopAnswer());
  initAttachments(byId('view-chat'), showError);
}
