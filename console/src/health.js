// health.js - what /health says about the server, shown in the header and
// refreshed every few seconds: the model's name, whether every process is
// ready, the task (an embedding or reranking model has no chat), and, for
// the generated demo model, a notice that its answers are noise by design.
// /health is open (no key); main.js starts this only once the key is known.
import { byId } from './dom.js';

const EVERY_MS = 5000;

const TASK_NOTICES = {
  embed: 'This model serves embeddings (/v1/embeddings): the chat is not available for it. The memory view works.',
  rerank: 'This model is a reranker (/v1/rerank, /v1/score): the chat is not available for it. The memory view works.',
};

function render(health, onTask) {
  byId('model-name').textContent = typeof health.model === 'string' ? health.model : '';
  const status = byId('server-status');
  status.textContent = health.status ?? 'unknown';
  status.dataset.status = health.status ?? 'unknown';
  status.title = health.status === 'ok' ? 'every process is ready'
    : 'a process is starting or coming back: requests may wait or get a 503';
  byId('demo-notice').hidden = health.demo_model !== true;
  const task = typeof health.task === 'string' ? health.task : 'generate';
  const notice = byId('task-notice');
  notice.textContent = TASK_NOTICES[task] ?? '';
  notice.hidden = !TASK_NOTICES[task];
  byId('model-task').textContent = task === 'generate' ? '' : task;
  onTask(task);
}

// onTask(task): called with /health's task after every look.
export function watchHealth(onTask) {
  const look = async () => {
    try {
      const response = await fetch('/health', { cache: 'no-store' });
      // 503 (starting, degraded) still carries the whole picture
      render(await response.json(), onTask);
    } catch {
      const status = byId('server-status');
      status.textContent = 'unreachable';
      status.dataset.status = 'unreachable';
      status.title = 'the server did not answer /health';
    }
    setTimeout(look, EVERY_MS);
  };
  return look();
}
