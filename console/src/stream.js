// stream.js - one streamed chat completion: POST /v1/chat/completions with
// stream: true, its server-sent events read with eventsource-parser, each
// chunk handed to the caller as it comes. Aborting the signal cancels the
// request (the server counts it as cancelled).
import { createParser } from 'eventsource-parser';
import { ApiError, apiFetch } from './api.js';
import { errorMessage } from './auth.js';

// Sends body (the request, stream fields added here), calls onOpen() once the
// server has accepted it (a 2xx) and onChunk(chunk) for every JSON chunk until
// `data: [DONE]` or the end of the stream.
// Rejects with an ApiError for an answer that is not 2xx and for an
// {"error": ...} event in the stream, with an AbortError when signal aborts.
export async function streamChatCompletion(body, { signal, onOpen = () => {}, onChunk }) {
  const response = await apiFetch('/v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  onOpen();

  let done = false;
  let failure = null;
  const parser = createParser({
    onEvent(event) {
      if (done || failure) return;
      if (event.data === '[DONE]') {
        done = true;
        return;
      }
      let chunk;
      try {
        chunk = JSON.parse(event.data);
      } catch {
        failure = new ApiError(response.status, `the server sent an event that is not JSON: ${event.data.slice(0, 200)}`);
        return;
      }
      if (chunk?.error) {
        failure = new ApiError(response.status, chunk.error.message ?? JSON.stringify(chunk.error));
        return;
      }
      onChunk(chunk);
    },
  });

  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let ended = false;
  try {
    while (!done && !failure) {
      const next = await reader.read();
      if (next.done) {
        ended = true;
        break;
      }
      parser.feed(next.value);
    }
  } finally {
    // stopped early ([DONE], an error event, an abort): nothing more is read
    if (!ended) reader.cancel().catch(() => {});
  }
  if (failure) throw failure;
}
