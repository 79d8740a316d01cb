// api.js - every call to the server's key-protected endpoints: the key as a
// Bearer header; a 401 asks for the key (auth.js) and goes again; an answer
// that is not 2xx becomes an ApiError carrying the server's message.
import { authorization, currentKey, errorMessage, requestKey } from './auth.js';

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }
}

// fetch(path, init) with the key. Resolves with the response, whatever its
// status but 401; rejects as fetch does (init.signal aborted, no network).
// A body must be a string, so that it can be sent again after a 401.
export async function apiFetch(path, init = {}) {
  for (;;) {
    const headers = { ...init.headers, ...authorization(currentKey()) };
    const response = await fetch(path, { cache: 'no-store', ...init, headers });
    if (response.status !== 401) return response;
    await requestKey(await errorMessage(response), init.signal);
  }
}

export async function apiJson(path, init) {
  const response = await apiFetch(path, init);
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  return response.json();
}

export async function apiText(path, init) {
  const response = await apiFetch(path, init);
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  return response.text();
}
