/* completions.c - the generation endpoints (see completions.h).
 *
 * Per request: parse + tokenize -> inflight entry -> REQUEST_SUBMIT. Per
 * TOKEN_CHUNK (completions_on_chunk): an error ends the request; else the
 * books, the tokens as text (reasoning until </think>), their
 * log-probabilities, how much may be shown (stop strings), what goes out,
 * and the choice's end. A choice's output is one state (inflight.h's
 * choice_state), moved only by choice_move, where its transitions are drawn.
 * What goes out is written by the request's answer_writer; this path builds
 * no JSON itself. Streams go through an h2o generator that has at most one
 * send in flight; bytes arriving meanwhile wait in `pending` and leave when
 * h2o calls proceed. After any h2o call the entry is looked up again by id:
 * h2o may have disposed the request in between. */
#include "completions.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api_limits.h"
#include "buf.h"
#include "clock.h"
#include "h2o_include.h"
#include "http_server.h"
#include "log.h"
#include "reasoning.h"
#include "response.h"
#include "tools.h"

#define CAPPED_HEADER "x-vlmd-max-tokens-capped"
#define SWEEP_MS 250
#define PENDING_MAX (1u << 20) /* stream bytes a client that does not read may leave behind */

typedef struct stream_gen {
    h2o_generator_t super;
    completions *c;
    uint64_t req_id;
} stream_gen;

static void cancel_at_engine(uint64_t req_id, void *ud)
{
    completions *c = ud;
    if (!c->peer)
        return;
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_CANCEL};
    m.u.request_cancel = (vlmd_msg_request_cancel){req_id, VLMD_FINISH_CANCELLED};
    vlmd_peer_send(c->peer, &m);
    VLMD_REQ_DEBUG(req_id, "cancelled at the engine"); /* counted in /metrics, not logged */
}

static void on_sweep(uv_timer_t *t);

/* Cancels every choice of e still running at the engine or queued at the
 * router, the last first: the router admits a request's choices in order,
 * so those still queued are forgotten before the room the running ones free
 * is handed out, which they would otherwise take, one by one, each sent to
 * the engine only to be cancelled there. */
static void cancel_choices(completions *c, const inflight_entry *e)
{
    for (uint32_t i = e->n_choices; i-- > 0;)
        if (e->choices[i].out.state != CHOICE_ENDED)
            cancel_at_engine(e->req_id + i, c);
}

/* inflight: the client went away before its answer */
static void client_gone(const inflight_entry *e, void *ud)
{
    completions *c = ud;
    metrics_finished(&c->metrics, e->engine, METRICS_CANCELLED);
    cancel_choices(c, e);
}

/* Adds id (a vocabulary's; -1: none) to ids[*n] once, at most cap. */
static void add_id(uint32_t *ids, uint32_t *n, uint32_t cap, int64_t id)
{
    if (id < 0 || *n == cap)
        return;
    for (uint32_t i = 0; i < *n; i++)
        if (ids[i] == (uint32_t)id)
            return;
    ids[(*n)++] = (uint32_t)id;
}

static void add_kept(completions *c, const vlmd_tokenizer *tok, const char *token)
{
    int64_t id = vlmd_tokenizer_find(tok, token);
    if (id >= 0 && vlmd_tokenizer_is_special(tok, (uint32_t)id))
        add_id(c->kept_ids, &c->n_kept, sizeof c->kept_ids / sizeof c->kept_ids[0], id);
}

void completions_init(completions *c, uv_loop_t *loop, const vlmd_tokenizer *tok,
                      const api_limits *limits, const image_limits *images)
{
    memset(c, 0, sizeof *c);
    metrics_init(&c->metrics);
    c->loop = loop;
    c->tok = tok;
    c->limits = *limits;
    c->images = *images;
    const char *stops[] = {"<|im_end|>", "<|endoftext|>"};
    const uint32_t cap = COMPLETIONS_MAX_END_IDS;
    for (int i = 0; i < 2; i++)
        add_id(c->stop_ids, &c->n_stop, cap, vlmd_tokenizer_find(tok, stops[i]));
    for (uint32_t i = 0; i < limits->n_end_ids; i++)
        add_id(c->stop_ids, &c->n_stop, cap, limits->end_ids[i]);
    /* the markers its answers are read by stay in the text where they are special (GLM's) */
    const vlmd_chat_family *f = limits->chat_family;
    const tool_format *tf = api_tool_format(limits);
    for (size_t i = 0; tf && tf->markers[i]; i++)
        add_kept(c, tok, tf->markers[i]);
    if (f && f->thinking) {
        add_kept(c, tok, REASONING_OPEN);
        add_kept(c, tok, REASONING_CLOSE);
    }
    inflight_init(&c->table, client_gone, c);
    preparer_init(&c->prep, loop);
    uv_timer_init(loop, &c->sweep);
    c->sweep.data = c;
    uv_timer_start(&c->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
}

void completions_stop(completions *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->sweep))
        uv_close((uv_handle_t *)&c->sweep, NULL);
}

void completions_free(completions *c)
{
    inflight_free(&c->table);
}

/* ---- streaming ------------------------------------------------------------------ */

static void stream_flush(completions *c, uint64_t req_id);

static void on_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    (void)req;
    stream_gen *sg = (stream_gen *)g;
    inflight_entry *e = inflight_find(&sg->c->table, sg->req_id);
    if (!e)
        return;
    e->sending = false;
    stream_flush(sg->c, sg->req_id);
}

/* Hands pending bytes to h2o when nothing is in flight; removes the entry
 * once the last bytes are out. */
static void stream_flush(completions *c, uint64_t req_id)
{
    inflight_entry *e = inflight_find(&c->table, req_id);
    if (!e || !e->req || e->sending || (!e->pending.len && !e->final_queued))
        return;
    h2o_req_t *req = e->req;
    char *copy = h2o_mem_alloc_pool(&req->pool, e->pending.len + 1); /* lives with req */
    memcpy(copy, e->pending.data ? e->pending.data : "", e->pending.len);
    h2o_iovec_t buf = h2o_iovec_init(copy, e->pending.len);
    bool final = e->final_queued;
    vlmd_buf_clear(&e->pending);
    e->sending = true;
    e->send_started_ns = vlmd_now_ns();
    if (final)
        inflight_remove(&c->table, e); /* nothing follows the last send */
    h2o_send(req, &buf, 1, final ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

void completions_stream_begin(completions *c, inflight_entry *e)
{
    if (e->started)
        return;
    e->started = true;
    h2o_req_t *req = e->req;
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("text/event-stream"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-store"));
    if (e->capped) {
        char *v = h2o_mem_alloc_pool(&req->pool, 16);
        int n = snprintf(v, 16, "%u", e->capped);
        h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT(CAPPED_HEADER), 0, NULL,
                              v, (size_t)n);
    }
    stream_gen *g = h2o_mem_alloc_pool(&req->pool, sizeof *g);
    *g = (stream_gen){{on_proceed, NULL}, c, e->req_id};
    h2o_start_response(req, &g->super);
    if (e->writer->begin)
        e->writer->begin(c, e);
}

/* Queues one SSE event (takes the reference). */
static void stream_event(inflight_entry *e, json_t *data)
{
    char *text = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    if (text)
        vlmd_buf_printf(&e->pending, "data: %s\n\n", text);
    free(text);
}

/* ---- logprobs ---------------------------------------------------------------------- */

/* A token as text (invalid UTF-8 shown as U+FFFD) and as its raw bytes. */
static json_t *token_text(const completions *c, uint32_t id)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_tokenizer_decode(c->tok, &id, 1, false, &b, NULL);
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    vlmd_buf_free(&b);
    return s ? s : json_string("");
}

static json_t *token_bytes(const completions *c, uint32_t id)
{
    const uint8_t *p;
    size_t n = 0;
    json_t *a = json_array();
    if (vlmd_tokenizer_token_bytes(c->tok, id, &p, &n))
        for (size_t i = 0; i < n; i++)
            json_array_append_new(a, json_integer(p[i]));
    return a;
}

/* chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]} */
static json_t *chat_logprobs(const completions *c, const token_logprobs *t, size_t n)
{
    json_t *content = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *top = json_array();
        for (uint32_t k = 0; k < t[i].n_top; k++)
            json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
                                                 token_text(c, t[i].top_ids[k]), "logprob",
                                                 (double)t[i].top_logprobs[k], "bytes",
                                                 token_bytes(c, t[i].top_ids[k])));
        json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token",
                                                 token_text(c, t[i].id), "logprob",
                                                 (double)t[i].logprob, "bytes",
                                                 token_bytes(c, t[i].id), "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static json_t *text_logprobs(const completions *c, const token_logprobs *t, size_t n,
                             size_t offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *text = token_text(c, t[i].id);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += json_string_length(text);
        json_array_append_new(tokens, text);
        json_array_append_new(lps, json_real(t[i].logprob));
        json_t *top = json_object();
        for (uint32_t k = 0; k < t[i].n_top; k++) {
            json_t *tt = token_text(c, t[i].top_ids[k]);
            json_object_set_new(top, json_string_value(tt), json_real(t[i].top_logprobs[k]));
            json_decref(tt);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *logprobs_json(const completions *c, const inflight_entry *e,
                             const token_logprobs *t, size_t n, size_t offset)
{
    if (!e->api.logprobs)
        return json_null();
    return e->api.chat ? chat_logprobs(c, t, n) : text_logprobs(c, t, n, offset);
}

/* ---- response bodies -------------------------------------------------------------- */

static void response_id(const inflight_entry *e, char *out, size_t outsz)
{
    snprintf(out, outsz, "%s-%016llx", e->api.chat ? "chatcmpl" : "cmpl",
             (unsigned long long)e->req_id);
}

/* Tokens of every prompt (each once, whatever n). */
static size_t prompt_tokens(const api_request *r)
{
    size_t n = 0;
    for (uint32_t i = 0; i < r->n_prompts; i++)
        n += r->prompts[i].n;
    return n;
}

void completions_usage(const inflight_entry *e, uint32_t *prompt, uint32_t *completion,
                       uint32_t *reasoning, uint32_t *cached)
{
    *prompt = (uint32_t)prompt_tokens(&e->api);
    *completion = *reasoning = 0;
    *cached = e->choices[0].cached_tokens;
    for (uint32_t i = 0; i < e->n_choices; i++) {
        *completion += e->choices[i].completion_tokens;
        *reasoning += e->choices[i].reasoning_tokens;
        *cached = e->choices[i].cached_tokens < *cached ? e->choices[i].cached_tokens : *cached;
    }
}

/* Each prompt counts once; completion tokens are every choice's; cached
 * tokens the fewest any choice was given. */
static json_t *usage_json(const inflight_entry *e)
{
    uint32_t prompt, completion, reasoning, cached;
    completions_usage(e, &prompt, &completion, &reasoning, &cached);
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)prompt,
                     "completion_tokens", (int)completion, "total_tokens",
                     (int)(prompt + completion), "prompt_tokens_details",
                     "cached_tokens", (int)cached);
}

/* A stream chunk: its choices (the reference is taken) in the envelope every chunk has. */
static json_t *stream_chunk(const completions *c, const inflight_entry *e, json_t *choices)
{
    char id[48];
    response_id(e, id, sizeof id);
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", id, "object",
                     e->api.chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)e->created_unix_s, "model", c->limits.model_name, "choices",
                     choices);
}

/* One streamed chunk of choice `index`: a piece of text (or, with finish,
 * its end); chat: reasoning (not NULL) goes out as reasoning_content, with
 * the content only when there is some. */
static json_t *chunk_json(const completions *c, const inflight_entry *e, uint32_t index,
                          const char *reasoning, size_t reasoning_len, const char *text,
                          size_t len, const char *finish, bool first, json_t *logprobs)
{
    if (!logprobs)
        logprobs = json_null();
    json_t *choice;
    if (e->api.chat) {
        json_t *delta = json_object();
        if (first)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (reasoning)
            json_object_set_new(delta, "reasoning_content",
                                json_stringn(reasoning, reasoning_len));
        if (len || (!finish && !reasoning))
            json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", (int)index, "delta", delta,
                           "logprobs", logprobs, "finish_reason",
                           finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:o}", "index", (int)index, "text", text, len,
                           "logprobs", logprobs, "finish_reason",
                           finish ? json_string(finish) : json_null());
    }
    if (finish && e->choices[index].grammar_closed)
        json_object_set_new(choice, "grammar_closed", json_true());
    return stream_chunk(c, e, json_pack("[o]", choice));
}

void completions_call_id(const inflight_entry *e, uint32_t index, uint32_t k, char *out,
                         size_t outsz)
{
    snprintf(out, outsz, "call_%016llx%02x%02x", (unsigned long long)e->req_id, index & 0xff,
             k & 0xff);
}

/* A choice that stopped after making calls finished with "tool_calls". */
static const char *finish_reason(const char *finish, bool called)
{
    return called && strcmp(finish, "stop") == 0 ? "tool_calls" : finish;
}

/* A block the answer was cut inside before it named a call, after calls:
 * what max_tokens left of another call, not text (dropped, stream or not). */
static bool trailing_fragment(const tool_call *call, size_t n_calls)
{
    return !call->name && call->cut && n_calls > 0;
}

/* The choice's answer is read for reasoning: the request thinks, and (where
 * the model may answer without thinking) the answer opened a think block. */
static bool choice_reasons(const inflight_entry *e, const inflight_choice *ch)
{
    return e->api.reasoning && !ch->out.unthought;
}

void completions_answer_of(const inflight_entry *e, uint32_t index, completions_answer *a)
{
    const inflight_choice *ch = &e->choices[index];
    const char *text = ch->text.data ? ch->text.data : "";
    const tool_format *f = e->api.tool_format;
    *a = (completions_answer){.finish = ch->out.finish};
    bool begun = false;
    size_t content_end = e->api.tools ? tool_content_end(f, text, ch->out.sent, true, &begun) : 0;
    bool all_calls = begun;
    size_t pos = content_end;
    tool_call call;
    while (all_calls &&
           tool_call_next(f, e->api.tool_schemas, text, ch->out.sent, true, &pos, &call)) {
        if (trailing_fragment(&call, a->n_calls)) {
            tool_call_free(&call);
            break;
        }
        all_calls = call.name != NULL;
        tool_call *grown = all_calls ? realloc(a->calls, (a->n_calls + 1) * sizeof *grown) : NULL;
        if (grown) {
            a->calls = grown;
            a->calls[a->n_calls++] = call;
        } else {
            all_calls = false; /* (out of memory: the text as it is) */
            tool_call_free(&call);
        }
    }
    bool reasoned = choice_reasons(e, ch);
    if (!all_calls || a->n_calls == 0) {
        completions_answer_free(a);
        a->finish = ch->out.finish;
        /* a thinking model's answer may be all reasoning: no content */
        a->content = ch->out.sent || !reasoned ? text : NULL;
        a->content_len = ch->out.sent;
    } else {
        a->finish = finish_reason(ch->out.finish, true);
        a->content = content_end ? text : NULL;
        a->content_len = content_end;
    }
    if (reasoned) {
        size_t start, end;
        const char *r = ch->reasoning.data ? ch->reasoning.data : "";
        reasoning_shown(r, ch->reasoning.len, true, &start, &end);
        a->reasoning = r + start;
        a->reasoning_len = end - start;
    }
}

void completions_answer_free(completions_answer *a)
{
    for (size_t k = 0; k < a->n_calls; k++)
        tool_call_free(&a->calls[k]);
    free(a->calls);
    a->calls = NULL;
    a->n_calls = 0;
}

/* A choice's message: content (null when there is none), tool_calls (each
 * {"id", "type", "function": {"name", "arguments"}}), reasoning_content. */
static json_t *chat_message(const inflight_entry *e, uint32_t i, const char **finish)
{
    completions_answer a;
    completions_answer_of(e, i, &a);
    *finish = a.finish;
    json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                a.content ? json_stringn(a.content, a.content_len) : json_null());
    if (a.n_calls) {
        json_t *calls = json_array();
        for (size_t k = 0; k < a.n_calls; k++) {
            char id[48];
            completions_call_id(e, i, (uint32_t)k, id, sizeof id);
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                                   "function", "function", "name",
                                                   a.calls[k].name, "arguments",
                                                   a.calls[k].arguments));
        }
        json_object_set_new(message, "tool_calls", calls);
    }
    if (a.reasoning)
        json_object_set_new(message, "reasoning_content",
                            json_stringn(a.reasoning, a.reasoning_len));
    completions_answer_free(&a);
    return message;
}

static json_t *full_json(const completions *c, const inflight_entry *e)
{
    char id[48];
    response_id(e, id, sizeof id);
    json_t *choices = json_array();
    for (uint32_t i = 0; i < e->n_choices; i++) {
        const inflight_choice *ch = &e->choices[i];
        const char *text = ch->text.data ? ch->text.data : "", *finish = ch->out.finish;
        json_t *lp = logprobs_json(c, e, ch->lps, ch->n_lps, ch->prompt_text_len);
        json_t *message = e->api.chat ? chat_message(e, i, &finish) : NULL;
        json_t *choice = e->api.chat ? json_pack("{s:i, s:o, s:o, s:s}", "index", (int)i,
                                                 "message", message, "logprobs", lp,
                                                 "finish_reason", finish)
                                     : json_pack("{s:i, s:s%, s:o, s:s}", "index", (int)i, "text",
                                                 text, ch->out.sent, "logprobs", lp,
                                                 "finish_reason", finish);
        if (ch->grammar_closed) /* (an extra field: clients ignore it) */
            json_object_set_new(choice, "grammar_closed", json_true());
        json_array_append_new(choices, choice);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
                     e->api.chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)e->created_unix_s, "model", c->limits.model_name, "choices",
                     choices, "usage", usage_json(e));
}

/* ---- the chat and completions writer ------------------------------------------------ */

static void openai_text(completions *c, inflight_entry *e, uint32_t index, const char *reasoning,
                        size_t reasoning_len, const char *content, size_t len, bool first,
                        const answer_logprobs *logprobs)
{
    json_t *lp = logprobs ? logprobs_json(c, e, logprobs->tokens, logprobs->n,
                                          logprobs->text_offset)
                          : NULL;
    stream_event(e, chunk_json(c, e, index, reasoning, reasoning_len, content, len, NULL, first,
                               lp));
}

/* A tool_calls delta of choice `index` (entry taken). */
static void call_delta(completions *c, inflight_entry *e, uint32_t index, json_t *entry,
                       bool first)
{
    json_t *delta = json_pack("{s:[o]}", "tool_calls", entry);
    if (first)
        json_object_set_new(delta, "role", json_string("assistant"));
    stream_event(e, stream_chunk(c, e, json_pack("[{s:i, s:o, s:n, s:n}]", "index", (int)index,
                                                 "delta", delta, "logprobs", "finish_reason")));
}

/* As OpenAI streams a call: its index, id, type and name first, then its
 * arguments in pieces (each {"index", "function": {"arguments"}}). */
static void openai_call_begin(completions *c, inflight_entry *e, uint32_t index, uint32_t k,
                              const char *name, const char *arguments, size_t len, bool first)
{
    char id[48];
    completions_call_id(e, index, k, id, sizeof id);
    call_delta(c, e, index, json_pack("{s:i, s:s, s:s, s:{s:s, s:s%}}", "index", (int)k, "id", id,
                                      "type", "function", "function", "name", name, "arguments",
                                      arguments, len), first);
}

static void openai_call_arguments(completions *c, inflight_entry *e, uint32_t index, uint32_t k,
                                  const char *piece, size_t len)
{
    call_delta(c, e, index, json_pack("{s:i, s:{s:s%}}", "index", (int)k, "function",
                                      "arguments", piece, len), false);
}

static void openai_call_end(completions *c, inflight_entry *e, uint32_t index, uint32_t k,
                            bool complete)
{
    (void)c, (void)e, (void)index, (void)k, (void)complete;
}

static void openai_choice_end(completions *c, inflight_entry *e, uint32_t index,
                              const char *finish)
{
    stream_event(e, chunk_json(c, e, index, NULL, 0, "", 0, finish, false, NULL));
}

static void openai_end(completions *c, inflight_entry *e)
{
    if (e->api.include_usage) {
        json_t *last = stream_chunk(c, e, json_array());
        json_object_set_new(last, "usage", usage_json(e));
        stream_event(e, last);
    }
    vlmd_buf_puts(&e->pending, "data: [DONE]\n\n");
}

static void openai_fail(completions *c, inflight_entry *e, const char *message, const char *code)
{
    (void)c;
    stream_event(e, vlmd_api_error_json(message, "server_error", NULL, code));
    vlmd_buf_puts(&e->pending, "data: [DONE]\n\n");
}

static json_t *openai_whole(completions *c, inflight_entry *e)
{
    return full_json(c, e);
}

static const answer_writer openai_writer = {
    .text = openai_text, .call_begin = openai_call_begin,
    .call_arguments = openai_call_arguments, .call_end = openai_call_end,
    .choice_end = openai_choice_end, .end = openai_end, .fail = openai_fail,
    .whole = openai_whole};

/* ---- stop strings ------------------------------------------------------------------ */

/* How much of the text may be shown: up to the first stop string (*hit set),
 * else all but a tail that could still grow into one. Before min_tokens
 * tokens nothing is searched (as vLLM does): the text so far counts as
 * searched. */
static size_t visible_end(const inflight_entry *e, inflight_choice *ch, bool *hit)
{
    *hit = false;
    const char *t = ch->text.data ? ch->text.data : "";
    size_t len = ch->text.len, best = len;
    bool too_early = ch->completion_tokens < e->api.min_tokens;
    for (int i = 0; !too_early && i < e->api.n_stops; i++) {
        size_t sl = strlen(e->api.stops[i]);
        size_t from = ch->checked + 1 > sl ? ch->checked + 1 - sl : 0;
        const char *p = from <= len ? memmem(t + from, len - from, e->api.stops[i], sl) : NULL;
        if (p && (size_t)(p - t) < best) {
            best = (size_t)(p - t);
            *hit = true;
        }
    }
    if (*hit)
        return best;
    ch->checked = len;
    /* hold back the longest tail that is a prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < e->api.n_stops; i++) {
        size_t k = vlmd_partial_suffix(t, len, e->api.stops[i]);
        hold = k > hold ? k : hold;
    }
    return len - hold;
}

/* ---- the request ------------------------------------------------------------------- */

/* Ends a request that has not started its answer with an error. */
static void fail_entry(completions *c, inflight_entry *e, const api_error *err)
{
    h2o_req_t *req = e->req;
    metrics_finished(&c->metrics, e->engine, METRICS_ERROR);
    inflight_remove(&c->table, e);
    vlmd_send_api_failure(req, err);
}

/* The same for a failure that names no parameter and has no code. */
static void fail_entry_with(completions *c, inflight_entry *e, vlmd_status what,
                            const char *message)
{
    api_error err;
    api_fail(&err, what, NULL, NULL, "%s", message);
    fail_entry(c, e, &err);
}

/* The request (prompt complete, images measured) to the router. */
static void submit(completions *c, inflight_entry *e)
{
    const api_request *r = &e->api;
    vlmd_image_ref *refs = r->n_images ? calloc(r->n_images, sizeof *refs) : NULL;
    if (r->n_images && !refs) {
        fail_entry_with(c, e, VLMD_ERR_NOMEM, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < r->n_images; i++) {
        const api_image *im = &r->images[i];
        refs[i] = (vlmd_image_ref){.token_offset = im->token_offset, .token_count = im->tokens,
                                   .grid_t = 1, .grid_h = im->grid_h, .grid_w = im->grid_w,
                                   .data = im->data, .n_data = (uint32_t)im->len};
        memcpy(refs[i].hash, im->hash, 32);
    }
    /* the end-of-turn tokens (unless it ignores them), then its own stop_token_ids */
    uint32_t stops[COMPLETIONS_MAX_END_IDS + API_MAX_STOP_IDS];
    uint32_t n_stops = r->ignore_eos ? 0 : c->n_stop;
    memcpy(stops, c->stop_ids, n_stops * sizeof *stops);
    memcpy(stops + n_stops, r->stop_token_ids, r->n_stop_token_ids * sizeof *stops);
    n_stops += r->n_stop_token_ids;
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){
        .max_tokens = r->max_tokens, .sampling = r->sampling, .stop_tokens = stops,
        .n_stop_tokens = n_stops, .min_tokens = r->min_tokens, .ignore_eos = r->ignore_eos,
        .logprobs = r->logprobs, .top_logprobs = r->top_logprobs, .images = refs,
        .n_images = r->n_images, .session = e->session, .logit_bias = r->logit_bias,
        .n_logit_bias = r->n_logit_bias,
        .grammar = {r->grammar.kind, r->grammar.text, (uint32_t)r->grammar.n_text,
                    r->grammar.trigger, r->grammar.trigger_after},
        .pooling = r->pooling, .pool_ids = (uint32_t *)r->pool_ids,
        .n_pool_ids = r->n_pool_ids};
    /* choice k: request req_id + k, of prompt k / n; a seeded request's choices of one
     * prompt differ, each reproducible */
    bool sent = c->peer != NULL;
    for (uint32_t k = 0; sent && k < e->n_choices; k++) {
        const vlmd_tokens *prompt = &r->prompts[k / r->n];
        m.u.request_submit.req_id = e->req_id + k;
        m.u.request_submit.tokens = prompt->ids;
        m.u.request_submit.n_tokens = (uint32_t)prompt->n;
        m.u.request_submit.sampling.seed = r->sampling.seed + k % r->n;
        sent = vlmd_peer_send(c->peer, &m) == VLMD_OK;
        for (uint32_t j = 0; !sent && j < k; j++)
            cancel_at_engine(e->req_id + j, c);
    }
    free(refs);
    for (uint32_t i = 0; i < r->n_images; i++) { /* the bytes went with the message */
        free(e->api.images[i].data);
        e->api.images[i].data = NULL;
    }
    if (!sent)
        fail_entry_with(c, e, VLMD_ERR_UNAVAILABLE, "the router is not reachable");
}

bool completions_prepare_images(const completions *c, api_request *r, api_error *err)
{
    for (uint32_t i = 0; i < r->n_images; i++)
        if (!image_input_resolve(&r->images[i], &c->images, err))
            return false;
    for (uint32_t i = 0; i < r->n_images; i++)
        if (r->images[i].remote && !image_input_fetch(&r->images[i], &c->images, err))
            return false;
    for (uint32_t i = 0; i < r->n_images; i++)
        if (!image_input_measure(&r->images[i], &c->images, err))
            return false;
    return !r->n_images || api_request_expand_images(r, &c->limits, err);
}

/* X-Session-ID (optional): up to 64 visible ASCII characters. */
static bool session_header(h2o_req_t *req, char *out, size_t outsz, api_error *err)
{
    ssize_t at = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-session-id"), -1);
    out[0] = '\0';
    if (at < 0)
        return true;
    h2o_iovec_t v = req->headers.entries[at].value;
    bool ok = v.len > 0 && v.len < outsz;
    for (size_t i = 0; ok && i < v.len; i++)
        ok = v.base[i] > 0x20 && v.base[i] < 0x7f;
    if (!ok)
        return api_fail(err, VLMD_ERR_INVALID_ARG, NULL, "invalid_session_id",
                        "X-Session-ID must be 1 to %zu visible ASCII characters", outsz - 1);
    memcpy(out, v.base, v.len);
    out[v.len] = '\0';
    return true;
}

bool completions_accepting(completions *c, h2o_req_t *req)
{
    api_error err;
    if (c->draining)
        api_fail(&err, VLMD_ERR_UNAVAILABLE, NULL, "shutting_down", "the server is shutting down");
    else if (c->router_down)
        api_fail(&err, VLMD_ERR_UNAVAILABLE, NULL, "router_unavailable",
                 "the router is not answering; try again");
    else if (!c->length_known) /* checked against a length the engine may not serve */
        api_fail(&err, VLMD_ERR_UNAVAILABLE, NULL, "engine_not_ready",
                 "the LLM engine is not ready yet (the context length it serves is not known); "
                 "try again");
    else
        return true;
    vlmd_send_api_failure(req, &err);
    return false;
}

/* The endpoints of each task, for the refusal's message. */
static const char *const task_endpoints[] = {
    [VLMD_TASK_GENERATE] = "/v1/chat/completions, /v1/completions and /v1/responses",
    [VLMD_TASK_EMBED] = "/v1/embeddings",
    [VLMD_TASK_RERANK] = "/v1/rerank and /v1/score",
};

bool completions_serves(const completions *c, h2o_req_t *req, vlmd_task want)
{
    if (vlmd_model_task_serves(&c->task, want))
        return true;
    api_error err;
    api_fail(&err, VLMD_ERR_INVALID_ARG, "model", "unsupported_task",
             "the model '%s' serves the task '%s' (%s), not '%s'; start vlmd with --task %s "
             "and a model made for it", c->limits.model_name, vlmd_task_name(c->task.task),
             task_endpoints[c->task.task], vlmd_task_name(want), vlmd_task_name(want));
    vlmd_send_api_failure(req, &err);
    return false;
}

void completions_start(completions *c, h2o_req_t *req, api_request *r, const answer_writer *w,
                       void *state, void (*state_free)(void *state))
{
    api_error err;
    inflight_entry *e = inflight_add(&c->table, req, r->n * r->n_prompts);
    if (!e) {
        api_request_free(r);
        if (state_free)
            state_free(state);
        api_fail(&err, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &err);
        return;
    }
    e->api = *r;
    e->writer = w;
    e->writer_state = state;
    e->writer_state_free = state_free;
    if (!session_header(req, e->session, sizeof e->session, &err)) {
        fail_entry(c, e, &err);
        return;
    }
    for (uint32_t i = 0; i < e->n_choices; i++) {
        inflight_choice *ch = &e->choices[i];
        ch->detok.skip_special = true;
        ch->out.state = r->reasoning ? CHOICE_THINKING : CHOICE_CONTENT;
        const vlmd_tokens *prompt = &r->prompts[i / r->n];
        if (r->echo) /* its prompt comes first, as written (its specials included) */
            vlmd_tokenizer_decode(c->tok, prompt->ids, prompt->n, false, &ch->text, NULL);
        if (r->answer_prefix) /* a forced call: read as if the model had written its start */
            vlmd_buf_puts(&ch->text, r->answer_prefix);
        ch->prompt_text_len = ch->text.len;
        ch->checked = ch->text.len; /* the echoed prompt is not searched for stops */
    }
    submit(c, e);
}

/* A chat or text completion from its body to its start: parsed, templated,
 * tokenized and its images readied on the pool (prepare.h). */
typedef struct completion_job {
    completions *c;
    bool chat;
    api_request r;              /* owned until completions_start takes it */
} completion_job;

static bool completion_work(void *arg, const json_t *body, api_error *err)
{
    completion_job *j = arg;
    return api_request_parse(body, j->chat, &j->c->limits, j->c->tok, &j->r, err) &&
           completions_prepare_images(j->c, &j->r, err);
}

static void completion_done(h2o_req_t *req, void *arg)
{
    completion_job *j = arg;
    completions_start(j->c, req, &j->r, &openai_writer, NULL, NULL);
    memset(&j->r, 0, sizeof j->r); /* taken */
}

static void completion_free(void *arg)
{
    completion_job *j = arg;
    api_request_free(&j->r);
    free(j);
}

static const prepare_ops completion_ops = {completion_work, completion_done, completion_free};

static void handle(h2o_req_t *req, completions *c, bool chat)
{
    if (!completions_accepting(c, req) || !completions_serves(c, req, VLMD_TASK_GENERATE))
        return;
    completion_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_error err;
        api_fail(&err, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &err);
        return;
    }
    *j = (completion_job){.c = c, .chat = chat};
    prepare_start(&c->prep, req, &completion_ops, j);
}

void completions_handle_text(h2o_req_t *req, void *ud)
{
    handle(req, ud, false);
}

void completions_handle_chat(h2o_req_t *req, void *ud)
{
    handle(req, ud, true);
}

/* Ends a request whose choices all ended: the last stream events, or the
 * whole answer. It counts as stopped when every choice stopped. */
static void request_end(completions *c, inflight_entry *e)
{
    uint64_t id = e->req_id;
    bool stopped = true;
    for (uint32_t i = 0; i < e->n_choices; i++)
        stopped = stopped && strcmp(e->choices[i].out.finish, "stop") == 0;
    metrics_observe_e2e(&c->metrics, e->engine, (double)(vlmd_now_ns() - e->start_ns) / 1e9);
    c->metrics.prompt_tokens += prompt_tokens(&e->api);
    metrics_finished(&c->metrics, e->engine, stopped ? METRICS_STOP : METRICS_LENGTH);
    if (e->api.pooling) {
        c->metrics.pooling_requests++;
        c->metrics.pooling_inputs += e->n_choices;
    }
    if (!e->api.stream) {
        h2o_req_t *req = e->req;
        json_t *resp = e->writer->whole(c, e);
        char capped[16];
        snprintf(capped, sizeof capped, "%u", e->capped);
        const char *header = e->capped ? CAPPED_HEADER : NULL;
        inflight_remove(&c->table, e);
        vlmd_send_json(req, 200, resp, header, capped);
        return;
    }
    completions_stream_begin(c, e);
    e->writer->end(c, e);
    e->final_queued = true;
    stream_flush(c, id);
}

/* ---- a choice's output ------------------------------------------------------------ */

/* A choice's state changes here only, along these edges:
 *
 *   THINKING --</think> (or, reasoning_optional, no think block opened)--> CONTENT
 *
 *   CONTENT --<tool_call> (tools, stream)--> CALL_HEAD <------------------------+
 *                                                  | a call's head: its name   |
 *                                                  v (and where its args are)  |
 *        CALL_TAIL <--its arguments' end (or the end)-- CALL_ARGUMENTS          |
 *            +---------its </tool_call> (or the end)----------------------------+
 *
 *   any state --the engine's finish, a stop string, an error--> ENDED (finish says why)
 *
 * A block in CALL_HEAD that is not a call, or is cut, goes out whole and
 * leaves the state as it is. */
static void choice_move(inflight_choice *ch, choice_state to)
{
    static const unsigned next[] = {
        [CHOICE_THINKING] = 1u << CHOICE_CONTENT,
        [CHOICE_CONTENT] = 1u << CHOICE_CALL_HEAD,
        [CHOICE_CALL_HEAD] = 1u << CHOICE_CALL_ARGUMENTS,
        [CHOICE_CALL_ARGUMENTS] = 1u << CHOICE_CALL_TAIL,
        [CHOICE_CALL_TAIL] = 1u << CHOICE_CALL_HEAD,
        [CHOICE_ENDED] = 0,
    };
    choice_state from = ch->out.state;
    VLMD_ASSERT(from != CHOICE_ENDED && (to == CHOICE_ENDED || (next[from] & (1u << to))));
    ch->out.state = to;
}

/* Ends the choice: why is "stop", "length" or "error". */
static void choice_stop(inflight_choice *ch, const char *why)
{
    choice_move(ch, CHOICE_ENDED);
    ch->out.finish = why;
}

/* The text is read as calls (a streamed answer with tools, past its first <tool_call>). */
static bool choice_calling(const inflight_choice *ch)
{
    return ch->out.state == CHOICE_CALL_HEAD || ch->out.state == CHOICE_CALL_ARGUMENTS ||
           ch->out.state == CHOICE_CALL_TAIL;
}

/* reasoning: once </think> has come, what follows it is content; where the
 * model may answer without thinking (reasoning_optional), an answer that
 * does not open with <think> is content from its start. final: nothing
 * more will come. */
static void end_reasoning(const inflight_entry *e, inflight_choice *ch, bool final)
{
    size_t at;
    if (ch->out.state != CHOICE_THINKING)
        return;
    if (e->api.reasoning_optional) {
        reasoning_open o = reasoning_opens(ch->reasoning.data ? ch->reasoning.data : "",
                                           ch->reasoning.len, final);
        if (o == REASONING_UNDECIDED)
            return;
        if (o == REASONING_NOT) {
            vlmd_buf_append(&ch->text, ch->reasoning.data ? ch->reasoning.data : "",
                            ch->reasoning.len);
            vlmd_buf_clear(&ch->reasoning);
            ch->reasoning_tokens = 0;
            ch->out.unthought = true;
            choice_move(ch, CHOICE_CONTENT);
            return;
        }
    }
    if (!reasoning_end(ch->reasoning.data, ch->reasoning.len, ch->reasoning_checked, &at)) {
        ch->reasoning_checked = ch->reasoning.len;
        return;
    }
    size_t after = at + strlen(REASONING_CLOSE);
    vlmd_buf_append(&ch->text, ch->reasoning.data + after, ch->reasoning.len - after);
    ch->reasoning.len = at;
    ch->reasoning.data[at] = '\0';
    choice_move(ch, CHOICE_CONTENT);
}

/* tools, streamed: content ends where the first <tool_call> begins (from
 * then on the choice is calling). */
static size_t streamed_content_end(const tool_format *f, inflight_choice *ch, size_t end,
                                   bool final)
{
    if (choice_calling(ch))
        return ch->out.sent;
    bool begun;
    size_t content_end = tool_content_end(f, ch->text.data ? ch->text.data : "", end, final,
                                          &begun);
    if (begun) {
        choice_move(ch, CHOICE_CALL_HEAD);
        ch->out.call_pos = content_end;
    }
    return content_end;
}

/* tools, streamed: the calls of text[call_pos..end) as they come. A block
 * that starts as a call (tools.h) begins with its name, then its arguments
 * go out as the format reads them, up to their end; any other block goes
 * out once it closes, as a whole call or as the text it is. */
static void stream_calls(completions *c, inflight_entry *e, uint32_t index, size_t end,
                         bool final)
{
    inflight_choice *ch = &e->choices[index];
    choice_output *o = &ch->out;
    const answer_writer *w = e->writer;
    const tool_format *f = e->api.tool_format;
    const json_t *tools = e->api.tool_schemas;
    const char *text = ch->text.data ? ch->text.data : "";
    for (;;) {
        if (o->state == CHOICE_CALL_ARGUMENTS) {
            vlmd_buf piece = VLMD_BUF_INIT;
            tool_args_read(f, &o->args, text, end, final, &piece);
            completions_stream_begin(c, e);
            if (piece.len)
                w->call_arguments(c, e, index, o->n_calls - 1, piece.data, piece.len);
            vlmd_buf_free(&piece);
            if (!o->args.closed && !final)
                return;
            w->call_end(c, e, index, o->n_calls - 1, o->args.closed);
            choice_move(ch, CHOICE_CALL_TAIL);
            o->call_pos = o->args.end;
        }
        if (o->state == CHOICE_CALL_TAIL) { /* the rest of the block, up to its close */
            bool found;
            size_t after = tool_call_close(f, text, end, o->call_pos, &found);
            if (!found && !final)
                return;
            choice_move(ch, CHOICE_CALL_HEAD);
            o->call_pos = after;
        }
        size_t open = tool_call_find(f, text, end, o->call_pos);
        if (open == end)
            return;
        char *name;
        tool_args args;
        tool_head head = tool_call_head(f, tools, text, end, open, &name, &args);
        if (head == TOOL_HEAD_WAIT && !final)
            return;
        bool first = !o->spoke;
        completions_stream_begin(c, e);
        if (head == TOOL_HEAD_CALL) {
            o->spoke = true;
            w->call_begin(c, e, index, o->n_calls++, name, "", 0, first);
            free(name);
            o->args = args;
            choice_move(ch, CHOICE_CALL_ARGUMENTS);
            continue;
        }
        tool_call call;
        size_t pos = o->call_pos;
        if (!tool_call_next(f, tools, text, end, final, &pos, &call))
            return;
        o->call_pos = pos;
        if (trailing_fragment(&call, o->n_calls)) {
            tool_call_free(&call);
            return;
        }
        o->spoke = true;
        if (call.name) {
            w->call_begin(c, e, index, o->n_calls++, call.name, call.arguments,
                          strlen(call.arguments), first);
            w->call_end(c, e, index, o->n_calls - 1, !call.cut);
        } else {
            w->text(c, e, index, NULL, 0, text + call.start, call.end - call.start, first, NULL);
        }
        tool_call_free(&call);
    }
}

/* reasoning_optional: the answer has not shown yet whether it opens a think
 * block (a token held then goes out as empty content, not reasoning). */
static bool undecided(const inflight_entry *e, const inflight_choice *ch)
{
    return e->api.reasoning_optional && ch->out.state == CHOICE_THINKING &&
           reasoning_opens(ch->reasoning.data ? ch->reasoning.data : "", ch->reasoning.len,
                           false) == REASONING_UNDECIDED;
}

/* Gives the client what of choice `index`'s text may go out, content up to
 * end (less a <tool_call> and what follows, which stream_calls sends as
 * calls) and the reasoning reasoning_shown allows. A stream sends one chunk
 * per generated token (more: not the choice's last), even when all its text
 * is held back; lp: this token's log-probabilities (NULL: none). A whole
 * answer only marks the text as shown. */
static void choice_write(completions *c, inflight_entry *e, uint32_t index, size_t end,
                         bool final, bool more, const answer_logprobs *lp)
{
    inflight_choice *ch = &e->choices[index];
    choice_output *o = &ch->out;
    size_t show = end; /* what may go out as content */
    if (e->api.tools && e->api.stream)
        show = streamed_content_end(e->api.tool_format, ch, end, final);
    bool thinking = o->state == CHOICE_THINKING;
    /* what may go out as reasoning: [reasoning_sent, shown) */
    const char *reasoning = ch->reasoning.data ? ch->reasoning.data : "";
    size_t r_start = 0, shown = 0;
    if (e->api.reasoning)
        reasoning_shown(reasoning, ch->reasoning.len, final || !thinking, &r_start, &shown);
    o->reasoning_sent = r_start > o->reasoning_sent ? r_start : o->reasoning_sent;
    bool reasoned = shown > o->reasoning_sent;
    if (e->api.stream && (reasoned || show > o->sent || (more && !choice_calling(ch)))) {
        /* (a token of reasoning held back: an empty reasoning_content) */
        bool first = !o->spoke;
        o->spoke = true;
        completions_stream_begin(c, e);
        bool with_reasoning = reasoned || (thinking && show <= o->sent && !undecided(e, ch));
        e->writer->text(c, e, index, with_reasoning ? reasoning + o->reasoning_sent : NULL,
                        reasoned ? shown - o->reasoning_sent : 0,
                        ch->text.data ? ch->text.data + o->sent : "", show - o->sent, first, lp);
    }
    o->reasoning_sent = shown > o->reasoning_sent ? shown : o->reasoning_sent;
    o->sent = show > o->sent ? show : o->sent;
    if (choice_calling(ch))
        stream_calls(c, e, index, end, final);
}

/* Ends choice `index` once its last text went out (why: "stop" or
 * "length"); the last choice to end ends the request. True when it did
 * (the entry is then gone, or its last bytes are queued). */
static bool choice_end(completions *c, inflight_entry *e, uint32_t index, const char *why)
{
    inflight_choice *ch = &e->choices[index];
    choice_stop(ch, why);
    if (e->api.stream) {
        completions_stream_begin(c, e);
        e->writer->choice_end(c, e, index, finish_reason(ch->out.finish, ch->out.n_calls));
    }
    if (++e->n_finished < e->n_choices)
        return false;
    request_end(c, e);
    return true;
}

/* ---- a chunk from the engine -------------------------------------------------------- */

/* An error chunk ends the whole request: answered with its status before
 * the answer began, else ended with the writer's error event. */
static void chunk_error(completions *c, inflight_entry *e, inflight_choice *ch,
                        const vlmd_msg_token_chunk *m)
{
    choice_stop(ch, "error");
    cancel_choices(c, e);
    if (!e->started) {
        /* an image the visual worker could not take is named as the request gave it */
        bool image = m->error_image && m->error_image <= e->api.n_images;
        api_error err = {vlmd_http_status_reported((vlmd_status)m->status), "", "",
                         image ? "invalid_image" : NULL};
        snprintf(err.message, sizeof err.message, "%s", m->message);
        if (image)
            snprintf(err.param, sizeof err.param, "%s", e->api.images[m->error_image - 1].param);
        fail_entry(c, e, &err);
        return;
    }
    metrics_finished(&c->metrics, e->engine, METRICS_ERROR);
    e->writer->fail(c, e, m->message, NULL);
    e->final_queued = true;
    stream_flush(c, e->req_id);
}

/* What a chunk tells the books: the router's cap on max_tokens, the cached
 * prompt tokens, the latencies, the tokens generated (and reasoned). */
static void chunk_metrics(completions *c, inflight_entry *e, inflight_choice *ch,
                          const vlmd_msg_token_chunk *m)
{
    if (m->max_tokens_capped > e->capped)
        e->capped = m->max_tokens_capped;
    e->engine = m->engine;
    ch->cached_tokens = m->cached_tokens;
    if (m->grammar_closed && !ch->grammar_closed) {
        ch->grammar_closed = true;
        c->metrics.grammar_closed++;
    }
    if (m->n_tokens) {
        uint64_t now = vlmd_now_ns();
        if (!e->last_token_ns)
            metrics_observe_ttft(&c->metrics, e->engine, (double)(now - e->start_ns) / 1e9);
        else
            metrics_observe_itl(&c->metrics, e->engine, (double)(now - e->last_token_ns) / 1e9);
        e->last_token_ns = now;
        c->metrics.completion_tokens += m->n_tokens;
    }
    ch->completion_tokens += m->n_tokens;
    if (ch->out.state == CHOICE_THINKING)
        ch->reasoning_tokens += m->n_tokens;
}

/* A pooling request's answer, kept for its writer. */
static void chunk_take_pooled(inflight_choice *ch, const vlmd_msg_token_chunk *m)
{
    if (!m->n_pooled || ch->pooled)
        return;
    ch->pooled = malloc(m->n_pooled * sizeof *ch->pooled);
    if (!ch->pooled)
        return; /* the writer answers 500 for a choice without its answer */
    memcpy(ch->pooled, m->pooled, m->n_pooled * sizeof *ch->pooled);
    ch->n_pooled = m->n_pooled;
}

/* A special token the answer is read by (its text is kept). */
static bool kept(const completions *c, uint32_t id)
{
    for (uint32_t i = 0; i < c->n_kept; i++)
        if (c->kept_ids[i] == id)
            return true;
    return false;
}

/* The chunk's tokens as text, whole characters only (its last chunk flushes
 * the rest): reasoning until </think> (end_reasoning moves what follows it
 * into the text), then text. */
static void chunk_take_tokens(const completions *c, const inflight_entry *e, inflight_choice *ch,
                              const vlmd_msg_token_chunk *m)
{
    vlmd_buf *into = ch->out.state == CHOICE_THINKING ? &ch->reasoning : &ch->text;
    for (uint32_t i = 0; i < m->n_tokens; i++) {
        ch->detok.skip_special = !kept(c, m->tokens[i]);
        vlmd_detok_push(&ch->detok, c->tok, m->tokens[i], into, NULL);
    }
    if (m->finish != VLMD_FINISH_NONE)
        vlmd_detok_flush(&ch->detok, c->tok, into);
    end_reasoning(e, ch, m->finish != VLMD_FINISH_NONE);
}

static bool grow_lps(inflight_choice *ch)
{
    token_logprobs *p = vlmd_grow(ch->lps, ch->n_lps, &ch->cap_lps, sizeof *p, 64);
    if (p)
        ch->lps = p;
    return p != NULL;
}

/* The chunk's log-probabilities (when asked for): kept for a whole answer,
 * or, streamed, copied into out (at most cap) for this chunk. Returns how
 * many were copied. */
static size_t chunk_logprobs(const inflight_entry *e, inflight_choice *ch,
                             const vlmd_msg_token_chunk *m, token_logprobs *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t i = 0; e->api.logprobs && i < m->n_logprobs; i++) {
        token_logprobs t = {.id = m->tokens[i], .logprob = m->logprobs[i],
                            .n_top = m->top_n > VLMD_MAX_TOP_LOGPROBS ? VLMD_MAX_TOP_LOGPROBS
                                                                      : m->top_n};
        for (uint32_t k = 0; k < t.n_top; k++) {
            t.top_ids[k] = m->top_ids[(size_t)i * m->top_n + k];
            t.top_logprobs[k] = m->top_logprobs[(size_t)i * m->top_n + k];
        }
        if (e->api.stream) {
            if (n < cap)
                out[n++] = t;
        } else if (grow_lps(ch)) {
            ch->lps[ch->n_lps++] = t;
        }
    }
    return n;
}

/* How much of the text may be shown after the chunk: up to a stop string
 * (*hit; the text is complete, so the engine may stop), else all but a tail
 * that could start one, released when the engine ends the choice. *final:
 * the choice ends with this chunk. */
static size_t chunk_visible_end(completions *c, const inflight_entry *e, inflight_choice *ch,
                                const vlmd_msg_token_chunk *m, bool *hit, bool *final)
{
    size_t end = visible_end(e, ch, hit);
    bool engine_ended = m->finish != VLMD_FINISH_NONE;
    if (*hit && !engine_ended)
        cancel_at_engine(m->req_id, c);
    else if (!*hit && engine_ended)
        end = ch->text.len; /* nothing more will come: release the held tail */
    *final = *hit || engine_ended;
    return end;
}

/* One TOKEN_CHUNK, in order: an error ends the request; else the books,
 * the tokens as text, their log-probabilities, what may be shown, what goes
 * out, and the choice's end. */
void completions_on_chunk(completions *c, const vlmd_msg_token_chunk *m)
{
    inflight_entry *e = inflight_find(&c->table, m->req_id);
    if (!e || !e->req || e->final_queued)
        return; /* a late reply for a request that is gone or has been answered */
    uint32_t index = (uint32_t)(m->req_id - e->req_id);
    inflight_choice *ch = &e->choices[index];
    if (ch->out.state == CHOICE_ENDED)
        return; /* a choice ended by a stop string: the engine's last tokens */
    if (m->finish == VLMD_FINISH_ERROR) {
        chunk_error(c, e, ch, m);
        return;
    }
    chunk_metrics(c, e, ch, m);
    chunk_take_pooled(ch, m);
    size_t text_before = ch->text.len;
    chunk_take_tokens(c, e, ch, m);
    token_logprobs lps[8];
    answer_logprobs lp = {lps, chunk_logprobs(e, ch, m, lps, sizeof lps / sizeof lps[0]),
                          text_before};
    bool hit, final;
    size_t end = chunk_visible_end(c, e, ch, m, &hit, &final);
    choice_write(c, e, index, end, final, m->finish == VLMD_FINISH_NONE, lp.n ? &lp : NULL);
    if (final &&
        choice_end(c, e, index, hit || m->finish == VLMD_FINISH_STOP ? "stop" : "length"))
        return;
    stream_flush(c, e->req_id);
}

/* ---- timeouts --------------------------------------------------------------------- */

/* A request past --request-timeout-s: cancelled at the engine, and answered
 * 504 or, when its stream has begun, ended with an error event. */
static void time_out(completions *c, inflight_entry *e)
{
    char msg[128];
    snprintf(msg, sizeof msg, "the request took longer than %llu s (--request-timeout-s)",
             (unsigned long long)(c->request_timeout_ns / 1000000000ull));
    cancel_choices(c, e);
    if (!e->started && !e->sending) {
        api_error err;
        api_fail(&err, VLMD_ERR_TIMEOUT, NULL, "timeout", "%s", msg);
        fail_entry(c, e, &err);
        return;
    }
    if (e->final_queued)
        return;
    metrics_finished(&c->metrics, e->engine, METRICS_ERROR);
    e->writer->fail(c, e, msg, "timeout");
    e->final_queued = true;
    stream_flush(c, e->req_id);
}

/* An HTTP/1.1 client that closed its connection before its answer began:
 * h2o writes nothing to it before then, so it would not notice, and the
 * request's choices would run on (a non-streamed one to its end). Cancelled
 * as a client gone, and the request ended. True when it was. */
static bool client_left(completions *c, inflight_entry *e)
{
    if (e->started || !c->http || !http_server_client_left(c->http, e->req))
        return false;
    h2o_req_t *req = e->req;
    client_gone(e, c);
    inflight_remove(&c->table, e);
    http_server_end_left(c->http, req);
    return true;
}

static void on_sweep(uv_timer_t *t)
{
    completions *c = t->data;
    uint64_t now = vlmd_now_ns();
    for (inflight_entry *e = c->table.head, *next; e; e = next) {
        next = e->next; /* e may be removed below */
        if (!e->req || client_left(c, e))
            continue;
        bool stuck = e->sending && (now - e->send_started_ns > c->send_timeout_ns ||
                                    e->pending.len > PENDING_MAX);
        if (stuck && c->http) {
            VLMD_REQ_WARN(e->req_id, "the client stopped reading: cut off (--send-timeout-s)");
            http_server_cut(c->http, e->req); /* h2o disposes it: cancelled as a client gone */
        } else if (now - e->start_ns > c->request_timeout_ns) {
            VLMD_REQ_WARN(e->req_id, "timed out (--request-timeout-s)");
            time_out(c, e);
        }
    }
}

void completions_fail_all(completions *c, const char *why)
{
    for (inflight_entry *e = c->table.head, *next; e; e = next) {
        next = e->next;
        if (!e->req)
            continue;
        uint32_t running = 0; /* a choice still waiting for the engine carries the error */
        while (running + 1 < e->n_choices && e->choices[running].out.state == CHOICE_ENDED)
            running++;
        vlmd_msg_token_chunk m = {.req_id = e->req_id + running, .finish = VLMD_FINISH_ERROR,
                                  .status = VLMD_ERR_UNAVAILABLE, .message = (char *)why};
        completions_on_chunk(c, &m);
    }
}
