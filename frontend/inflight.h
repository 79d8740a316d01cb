/* inflight.h - the frontend's requests waiting on the engine.
 *
 * Each entry ties a block of request ids (unique in this process; one per
 * choice, n of them) to the HTTP request that will get the answer, and
 * collects each choice's generated tokens. When the
 * client goes away first, h2o disposes its request pool; the dispose hook
 * detaches the entry, which is then cancelled at the engine and dropped when
 * its last chunk arrives (a late reply for a dead request is dropped). */
#ifndef VLMD_INFLIGHT_H
#define VLMD_INFLIGHT_H

#include <stdbool.h>
#include <stdint.h>

#include "api_limits.h"
#include "api_request.h"
#include "tokenizer.h"
#include "tools.h"

typedef struct st_h2o_req_t h2o_req_t;
typedef struct inflight inflight;

/* One generated token's log-probabilities, kept for a non-streamed answer. */
typedef struct token_logprobs {
    uint32_t id;
    float logprob;
    uint32_t n_top;
    uint32_t top_ids[VLMD_MAX_TOP_LOGPROBS];
    float top_logprobs[VLMD_MAX_TOP_LOGPROBS];
} token_logprobs;

/* Where a choice's output stands: the text is reasoning until </think>, then
 * content (where the model may answer without thinking, an answer that opens
 * no think block is content at once); a streamed answer with tools reads its text as calls from the
 * first <tool_call> on (the head of the next block, a call's arguments as
 * they come, the rest of its block); a choice ends once. completions.c moves
 * it, in choice_move, where the transitions are drawn. */
typedef enum choice_state {
    CHOICE_THINKING,            /* reasoning: no </think> yet, the text goes to reasoning */
    CHOICE_CONTENT,             /* the text is content */
    CHOICE_CALL_HEAD,           /* tools, stream: the next <tool_call>'s head is awaited */
    CHOICE_CALL_ARGUMENTS,      /* tools, stream: call n_calls - 1's arguments are streaming */
    CHOICE_CALL_TAIL,           /* tools, stream: they closed; its </tool_call> is awaited */
    CHOICE_ENDED,               /* finish says why */
} choice_state;

/* What of a choice has gone out, and where its output stands. */
typedef struct choice_output {
    choice_state state;
    const char *finish;         /* ENDED: "stop", "length" or "error"; NULL before */
    bool spoke;                 /* a stream chunk of it went out (chat: the role with it) */
    size_t sent;                /* bytes of text given to the client (or kept for the answer) */
    size_t reasoning_sent;      /* reasoning: bytes of it streamed (past a leading <think>) */
    size_t call_pos;            /* CALL_*: text before this is split into content and calls */
    bool unthought;             /* reasoning_optional: the answer opened no think block,
                                 * so it is all content (reasoning_content absent) */
    uint32_t n_calls;           /* tools, stream: calls begun */
    tool_args args;             /* CALL_ARGUMENTS: where call n_calls - 1's arguments are */
} choice_output;

/* One of a request's n choices: the engine request that generates it and
 * what it has produced. */
typedef struct inflight_choice {
    vlmd_detok detok;           /* generated ids -> text, whole characters only */
    vlmd_buf text;              /* generated text so far (echoed prompt first) */
    size_t checked;             /* bytes of text already searched for stop strings */
    size_t prompt_text_len;     /* bytes of echoed prompt (or forced call) it starts with */
    uint32_t completion_tokens;
    uint32_t cached_tokens;     /* prompt tokens the engine's prefix cache gave */
    bool grammar_closed;        /* its grammar closed it near max_tokens (the engine said) */
    vlmd_buf reasoning;         /* reasoning: the answer before </think> */
    size_t reasoning_checked;   /* reasoning: bytes of it searched for </think> */
    uint32_t reasoning_tokens;  /* reasoning: tokens generated before </think> */
    choice_output out;
    token_logprobs *lps;        /* non-streamed logprobs: one per generated token */
    size_t n_lps, cap_lps;
    float *pooled;              /* a pooling request's answer (owned), from its last chunk */
    uint32_t n_pooled;
} inflight_choice;

struct answer_writer;

typedef struct inflight_entry {
    uint64_t req_id;            /* choice i is the engine's request req_id + i */
    const struct answer_writer *writer; /* how the answer is written (completions.h) */
    void *writer_state;         /* owned: the writer's own, freed by writer_state_free */
    void (*writer_state_free)(void *state);
    uint32_t n_choices, n_finished;
    inflight_choice *choices;
    h2o_req_t *req;             /* NULL once the client is gone */
    api_request api;            /* what was asked (owned) */
    int64_t created_unix_s;
    bool started;               /* the response (headers) has begun */
    bool sending;               /* an h2o_send is in flight: wait for proceed */
    bool final_queued;          /* the last bytes wait in pending */
    vlmd_buf pending;           /* stream bytes not handed to h2o yet */
    uint64_t start_ns;          /* arrival, for the latency metrics */
    uint64_t last_token_ns;     /* 0 until the first token */
    uint64_t send_started_ns;   /* when the h2o_send in flight began */
    uint32_t capped;            /* the router capped max_tokens to this (0: not) */
    uint32_t engine;            /* the engine its chunks came from (the metrics' label) */
    char session[65];           /* X-Session-ID, "" when none */
    struct inflight_entry *next;
    inflight *owner;
} inflight_entry;

/* Called when a client vanished before its answer (to cancel its choices at
 * the engine). */
typedef void (*inflight_gone_fn)(const inflight_entry *e, void *ud);

struct inflight {
    inflight_entry *head;
    uint64_t next_id;
    inflight_gone_fn gone;
    void *ud;
    size_t count;
};

void inflight_init(inflight *t, inflight_gone_fn gone, void *ud);
/* Adds an entry of n_choices choices for req (hooking its dispose); NULL on
 * allocation failure. */
inflight_entry *inflight_add(inflight *t, h2o_req_t *req, uint32_t n_choices);
/* The entry one of whose choices is the engine's request req_id. */
inflight_entry *inflight_find(inflight *t, uint64_t req_id);
/* Removes and frees an entry (its HTTP request, if any, is not answered here).
 * An entry whose client went away is removed by inflight itself. */
void inflight_remove(inflight *t, inflight_entry *e);
void inflight_free(inflight *t);

#endif
