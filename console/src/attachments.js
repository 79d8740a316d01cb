// attachments.js - the images waiting to go with the next message: pasted
// into the prompt, dropped on the chat or picked with the file input, read
// as data: URIs (the server takes them inline; its limits decide, and its
// 400 says why), shown as thumbnails each with a remove button.
import { byId, h } from './dom.js';
import { newId } from './store.js';

let pending = []; // [{id, url, name}]
let reading = Promise.resolve(); // files still being read

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function render() {
  byId('attachments').replaceChildren(...pending.map((image) => h('figure', { className: 'attachment' },
    h('img', { src: image.url, alt: image.name || 'attached image' }),
    h('button', {
      type: 'button',
      className: 'remove',
      textContent: '×',
      title: 'Remove this image',
      attrs: { 'aria-label': `Remove ${image.name || 'this image'}` },
      onclick: () => {
        pending = pending.filter((p) => p !== image);
        render();
        byId('prompt').focus();
      },
    }))));
}

function addFiles(files, onError) {
  reading = reading.then(() => readFiles(files, onError));
  return reading;
}

async function readFiles(files, onError) {
  for (const file of files) {
    if (!file.type.startsWith('image/')) {
      onError(`${file.name || 'that file'} is not an image`);
      continue;
    }
    try {
      pending.push({ id: newId(), url: await readAsDataUrl(file), name: file.name });
    } catch (e) {
      onError(`could not read ${file.name}: ${e?.message ?? e}`);
    }
  }
  render();
}

// The images to send (once those being read are in), taken out of the composer.
export async function takeAttachments() {
  await reading;
  const taken = pending;
  pending = [];
  render();
  return taken;
}

// Puts images back (a message the server refused goes back to the composer).
export function restoreAttachments(images) {
  pending = [...images, ...pending];
  render();
}

// dropZone: where files may be dropped; onError(message) for what cannot be read.
export function initAttachments(dropZone, onError) {
  const input = byId('image-input');
  input.addEventListener('change', () => {
    const files = [...input.files];
    input.value = ''; // so the same file can be picked again
    addFiles(files, onError);
  });
  byId('prompt').addEventListener('paste', (event) => {
    const files = [...(event.clipboardData?.files ?? [])].filter((f) => f.type.startsWith('image/'));
    if (files.length === 0) return; // text pastes as text
    event.preventDefault();
    addFiles(files, onError);
  });
  const hasFiles = (event) => [...(event.dataTransfer?.types ?? [])].includes('Files');
  dropZone.addEventListener('dragover', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
    dropZone.classList.add('dropping');
  });
  dropZone.addEventListener('dragleave', (event) => {
    if (!dropZone.contains(event.relatedTarget)) dropZone.classList.remove('dropping');
  });
  dropZone.addEventListener('drop', (event) => {
    dropZone.classList.remove('dropping');
    if (!hasFiles(event)) return;
    event.preventDefault();
    addFiles([...event.dataTransfer.files], onError);
  });
}
