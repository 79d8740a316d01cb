/* responses.h - OpenAI's Responses API: POST /v1/responses, GET and DELETE
 * /v1/responses/{id}.
 *
 * Another request shape and another answer over the chat's generation
 * (completions.h): the request's input items (messages, function calls and
 * their outputs, reasoning), instructions and tools are built into the same
 * chat (api_request.h's api_chat) and prompt, generated, stopped and split
 * into reasoning, content and calls as a chat is; the answer is a response
 * object, or its event stream (response.created ... response.completed),
 * written here. Completed responses are kept in the store
 * (responses_store.h) unless "store": false, so that previous_response_id
 * can continue them. docs/API.md lists every field. */
#ifndef VLMD_RESPONSES_H
#define VLMD_RESPONSES_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "api_request.h"
#include "buf.h"
#include "completions.h"
#include "responses_store.h"

typedef struct st_h2o_req_t h2o_req_t;

/* What the routes need (borrowed). */
typedef struct responses {
    completions *c;
    responses_store *store;
} responses;

/* Route handlers (ud is the responses). */
void responses_handle_create(h2o_req_t *req, void *ud);
void responses_handle_get(h2o_req_t *req, void *ud);
void responses_handle_delete(h2o_req_t *req, void *ud);

/* ---- the request ----------------------------------------------------------------- */

/* What a request asks beyond its generation (owned). */
typedef struct responses_job {
    char id[40];                /* "resp_" and 128 random bits in hex: not guessable */
    json_t *echo;               /* the request's fields the answer repeats */
    json_t *conversation;       /* the input items, those of previous_response_id first */
    bool store;                 /* keep the completed response */
    responses_store *to;        /* borrowed: where it is kept */
    struct responses_events *ev; /* streamed: the events written so far */
} responses_job;

void responses_job_free(void *job);

/* Parses a /v1/responses body into the generation r asks for (r->chat; the
 * prompt's errors name "input") and *job. store (may be NULL: nothing is
 * stored) gives previous_response_id's conversation. False with e filled (a
 * 400 naming the field, a 404 for another model); r and *job are then empty. */
bool responses_request_parse(const json_t *body, const api_limits *lim,
                             const vlmd_tokenizer *tok, responses_store *store, uint64_t now_ms,
                             api_request *r, responses_job **job, api_error *e);

/* ---- the answer ------------------------------------------------------------------ */

typedef enum responses_item {
    RESPONSES_ITEM_NONE,
    RESPONSES_ITEM_MESSAGE,
    RESPONSES_ITEM_REASONING,
    RESPONSES_ITEM_CALL,
} responses_item;

/* The output of one response as it is written: each piece of text or call
 * opens the item it belongs to (closing the one before) and, streamed,
 * appends its events (`event: TYPE` / `data: {...}` with sequence_number)
 * to out. Written whole (out NULL) the same calls give the same items. */
typedef struct responses_events {
    char id[40];                /* the response's "resp_..."; items' ids derive from it */
    vlmd_buf *out;              /* borrowed; NULL: no events */
    uint64_t seq;               /* the next sequence_number */
    json_t *output;             /* owned: the items closed so far */
    responses_item open;        /* the item being written */
    char item_id[64];
    vlmd_buf text;              /* its text (message, reasoning) or arguments (call) */
    char *call_name;            /* owned: the open call's */
    char call_id[48];
} responses_events;

void responses_events_init(responses_events *ev, const char *id, vlmd_buf *out);
void responses_events_free(responses_events *ev);
/* A lifecycle event: response.created, .in_progress, .completed, .incomplete
 * or .failed, carrying response (taken). */
void responses_events_response(responses_events *ev, const char *type, json_t *response);
/* An error event (before response.failed); code may be NULL. */
void responses_events_error(responses_events *ev, const char *message, const char *code);
void responses_events_reasoning(responses_events *ev, const char *text, size_t len);
void responses_events_text(responses_events *ev, const char *text, size_t len);
void responses_events_call_begin(responses_events *ev, const char *call_id, const char *name);
void responses_events_call_arguments(responses_events *ev, const char *piece, size_t len);
/* Closes the open item: its .done events, then it joins output with status
 * "completed" (complete) or "incomplete". */
void responses_events_close(responses_events *ev, bool complete);
/* Ends the output: closes the open item; an output with nothing in it gets
 * an empty message, so every answer has its text. */
void responses_events_finish(responses_events *ev, bool complete);

/* The response object: job's echoed fields with id, created_at, status,
 * output (taken), usage (taken; NULL: null), error (taken; NULL: null) and
 * incomplete_details (status "incomplete": max_output_tokens). */
json_t *responses_object(const responses_job *job, const char *id, int64_t created_at,
                         const char *status, json_t *output, json_t *usage, json_t *error);

#endif
