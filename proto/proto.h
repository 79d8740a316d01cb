/* proto.h - every message between vlmd processes, defined once.
 *
 * Wire format: one ZeroMQ frame per message holding a msgpack array
 *   [version (uint), type (uint), body (map of string keys)]
 * Bodies are maps so that fields can be added within a version: decoders
 * ignore keys they do not know and require the ones they do. Types and
 * enum values only grow (append-only). A decoder checks every type, length
 * and limit before it trusts anything; on failure it returns VLMD_ERR_PROTO
 * (or VLMD_ERR_VERSION / VLMD_ERR_TOO_LARGE), leaves *out zeroed and owns no
 * memory, so a malformed message is dropped and counted, never half-used.
 *
 * Who owns a message (one rule in every process): decoded variable-length
 * fields (arrays, strings, bytes) are owned by the message and freed by
 * vlmd_msg_free(). A handler is lent the message for the call; to keep it
 * past the call it takes it with vlmd_msg_take (a move: the lender's copy is
 * left empty, and freeing that is a no-op), never re-encodes or copies it
 * field by field. Encoding borrows the message. */
#ifndef VLMD_PROTO_H
#define VLMD_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api_limits.h"
#include "buf.h"
#include "role.h"
#include "status.h"

#define VLMD_PROTO_VERSION 1

/* Limits a decoder enforces (a message over them is rejected whole). */
#define VLMD_PROTO_MAX_MSG_BYTES (96u << 20)     /* one frame */
#define VLMD_PROTO_MAX_TOKENS (1u << 20)         /* token ids in one message */
#define VLMD_PROTO_MAX_POOL_IDS 16               /* token ids whose logits a scoring request takes */
#define VLMD_PROTO_MAX_POOLED (1u << 16)         /* floats a pooling request's answer carries */
#define VLMD_PROTO_MAX_IMAGES 64                 /* image refs in one request */
#define VLMD_PROTO_MAX_IMAGE_BYTES (64u << 20)   /* one encoded image */
#define VLMD_PROTO_MAX_STR 4096                  /* any string field */
#define VLMD_PROTO_MAX_CONFIG 256                /* entries in a config map */
#define VLMD_PROTO_MAX_WORKERS 64                /* entries in a stats snapshot */
#define VLMD_PROTO_MAX_STOPS 16                  /* stop token ids per request */
#define VLMD_PROTO_MAX_LOGIT_BIAS 1024           /* logit_bias entries per request */
#define VLMD_PROTO_MAX_GRAMMAR_BYTES (1u << 20)  /* a grammar's text: structured.h's
                                                  * VLMD_GRAMMAR_MAX_SCHEMA_BYTES */

/* Wire values, append-only. */
typedef enum vlmd_msg_type {
    VLMD_MSG_HELLO = 1,             /* process -> router: I am role/rank, pid, config */
    VLMD_MSG_WELCOME = 2,           /* router -> process: answer to hello or unknown heartbeat */
    VLMD_MSG_READY = 3,             /* process -> router: start-up done (reservation, capacity) */
    VLMD_MSG_HEARTBEAT = 4,         /* process -> router: still alive */
    VLMD_MSG_FOOTPRINT_REQUEST = 5, /* llm -> router: peer footprint, once visual reserved */
    VLMD_MSG_FOOTPRINT_REPLY = 6,   /* router -> llm: bytes the peers reserved on the device */
    VLMD_MSG_WORKER_EXIT = 7,       /* launcher -> router: a child exited */
    VLMD_MSG_STATS_SNAPSHOT = 8,    /* router -> frontend, launcher: every process's state */
    VLMD_MSG_SHUTDOWN = 9,          /* router -> process: exit cleanly */
    VLMD_MSG_REQUEST_SUBMIT = 10,   /* frontend -> router -> llm: generate for these tokens */
    VLMD_MSG_REQUEST_CANCEL = 11,   /* frontend -> router -> llm: stop a request */
    VLMD_MSG_TOKEN_CHUNK = 12,      /* llm -> router -> frontend: generated tokens, finish */
    VLMD_MSG_IMAGE_JOB = 13,        /* router -> visual: encode one image */
    VLMD_MSG_IMAGE_RESULT = 14,     /* visual -> router: where the embeddings are */
    VLMD_MSG_RESTARTS = 15,         /* launcher -> router: how often it restarted each child */
    VLMD_MSG_GROUP_ID = 16,         /* llm <-> router: the rendezvous of the engine's ranks */
    VLMD_MSG_TYPE_MAX = 16
} vlmd_msg_type;

/* Process states as the router sees them; wire values, append-only. */
typedef enum vlmd_worker_state {
    VLMD_WORKER_DOWN = 0,       /* not running, or silent past the heartbeat timeout */
    VLMD_WORKER_STARTING = 1,   /* said hello, not ready yet */
    VLMD_WORKER_READY = 2,      /* serving */
    VLMD_WORKER_STATE_COUNT
} vlmd_worker_state;

/* How a request ended; wire values, append-only. */
typedef enum vlmd_finish_reason {
    VLMD_FINISH_NONE = 0,       /* still running: more chunks follow */
    VLMD_FINISH_STOP = 1,       /* EOS or a stop token/string */
    VLMD_FINISH_LENGTH = 2,     /* max_tokens or the model's length */
    VLMD_FINISH_CANCELLED = 3,  /* the client went away or cancelled */
    VLMD_FINISH_ERROR = 4,      /* failed; status and message say why */
    VLMD_FINISH_COUNT
} vlmd_finish_reason;

/* What a request's output is held to (constrained decoding, structured/);
 * wire values, append-only. The text each kind carries is in
 * vlmd_request_grammar. */
typedef enum vlmd_grammar_kind {
    VLMD_GRAMMAR_NONE = 0,          /* free text */
    VLMD_GRAMMAR_JSON_SCHEMA = 1,   /* a JSON Schema */
    VLMD_GRAMMAR_JSON_OBJECT = 2,   /* any JSON object (no text) */
    VLMD_GRAMMAR_REGEX = 3,         /* a regular expression the whole output matches */
    VLMD_GRAMMAR_CHOICE = 4,        /* a JSON list of strings: the output is one of them */
    VLMD_GRAMMAR_TOOL_CALLS = 5,    /* hermes tool calls: structured.h's tool-call spec */
    VLMD_GRAMMAR_KIND_COUNT
} vlmd_grammar_kind;

const char *vlmd_msg_type_str(vlmd_msg_type t);
const char *vlmd_grammar_kind_str(vlmd_grammar_kind k);
const char *vlmd_worker_state_str(vlmd_worker_state s);
const char *vlmd_finish_reason_str(vlmd_finish_reason r);

/* One configuration entry ("port" -> "8000"). */
typedef struct vlmd_kv {
    char *key;
    char *value;
} vlmd_kv;

typedef struct vlmd_msg_hello {
    uint32_t role;              /* vlmd_role */
    uint32_t rank;              /* tensor-parallel rank (0 unless several) */
    int64_t pid;
    uint64_t start_wall_ms;     /* when the process started, wall clock */
    char *version;              /* VLMD_VERSION of the sender */
    vlmd_kv *config;            /* effective flags of the sender */
    uint32_t n_config;
} vlmd_msg_hello;

typedef struct vlmd_msg_welcome {
    bool known;                 /* false: the router does not know the sender; say hello again */
    int64_t router_pid;
} vlmd_msg_welcome;

typedef struct vlmd_msg_ready {
    uint32_t role, rank;
    uint64_t reserved_bytes;        /* device memory the process holds for good */
    uint64_t kv_capacity_tokens;    /* llm: tokens the KV cache holds (0 = not measured yet) */
    char *device;                   /* e.g. "cpu", "NVIDIA H100 80GB HBM3" */
    char *listen_url;               /* frontend: "http://127.0.0.1:8000"; "" for others */
    vlmd_kv *memory;                /* how its device memory was measured and split (optional) */
    uint32_t n_memory;
    vlmd_kv *settings;              /* settings decided at start-up, such as whether CUDA graphs
                                     * were captured: /health shows them beside the flags
                                     * (optional) */
    uint32_t n_settings;
} vlmd_msg_ready;

typedef struct vlmd_msg_heartbeat {
    uint32_t role, rank;
    int64_t pid;
    uint32_t state;                 /* vlmd_worker_state as the sender sees itself */
    uint64_t seq;
    uint64_t kv_used_tokens;        /* llm: KV slots in use now (optional on the wire) */
    vlmd_kv *counters;              /* its counters now, name -> decimal (optional) */
    uint32_t n_counters;
} vlmd_msg_heartbeat;

typedef struct vlmd_msg_footprint_request {
    uint32_t rank;
} vlmd_msg_footprint_request;

typedef struct vlmd_msg_footprint_reply {
    uint64_t peer_bytes;            /* device bytes reserved by other processes on this GPU */
} vlmd_msg_footprint_reply;

typedef struct vlmd_msg_worker_exit {
    uint32_t role, rank;
    int64_t pid;
    int32_t exit_status;            /* exit code, or -1 when killed by a signal */
    int32_t term_signal;            /* signal number, 0 when it exited */
} vlmd_msg_worker_exit;

/* One child of the launcher and how often the launcher restarted it. */
typedef struct vlmd_restart_count {
    uint32_t role, rank;
    uint32_t restarts;
} vlmd_restart_count;

/* The launcher owns the restart counts (a restarted router starts from none):
 * it sends them whenever the router's snapshot shows others. */
typedef struct vlmd_msg_restarts {
    vlmd_restart_count *children;
    uint32_t n_children;
} vlmd_msg_restarts;

/* The rendezvous of a tensor-parallel group (comm.h's vlmd_comm_id as bytes).
 * Rank 0 sends the one it made; a rank above 0 sends an empty one to ask,
 * and the router answers with rank 0's latest (at once, or when it comes).
 * Rank 0 sends an empty one once every rank has joined, and the router
 * forgets it then or when rank 0 restarts: a rank restarted later waits for
 * the next group's. */
#define VLMD_PROTO_MAX_GROUP_ID_BYTES 1024
typedef struct vlmd_msg_group_id {
    uint32_t rank;                  /* the sender's (router -> llm: 0) */
    uint8_t *id;
    uint32_t n_id;
} vlmd_msg_group_id;

/* One process as the router sees it. */
typedef struct vlmd_worker_info {
    uint32_t role, rank;
    uint32_t state;                 /* vlmd_worker_state */
    int64_t pid;                    /* 0 when never seen */
    uint64_t uptime_ms;             /* since its hello; 0 when down */
    uint32_t restarts;              /* the launcher's count, else hellos from a new pid */
    uint64_t reserved_bytes;
    uint64_t kv_capacity_tokens;
    char *version;
    char *device;
    char *listen_url;
    vlmd_kv *config;
    uint32_t n_config;
    uint64_t kv_used_tokens;        /* llm: from its last heartbeat (optional on the wire) */
    vlmd_kv *memory;                /* from its READY (optional) */
    uint32_t n_memory;
    vlmd_kv *counters;              /* from its last heartbeat (optional) */
    uint32_t n_counters;
} vlmd_worker_info;

typedef struct vlmd_msg_stats_snapshot {
    uint64_t seq;                   /* grows with every snapshot */
    uint64_t dropped_messages;      /* malformed or undeliverable, counted by the router */
    vlmd_worker_info *workers;
    uint32_t n_workers;
} vlmd_msg_stats_snapshot;

typedef struct vlmd_msg_shutdown {
    char *reason;
    uint64_t drain_ms;              /* time to finish running requests */
} vlmd_msg_shutdown;

/* Sampling settings of one request. */
typedef struct vlmd_sampling {
    double temperature;             /* 0 = greedy */
    double top_p;                   /* (0, 1] */
    int32_t top_k;                  /* -1 = off */
    double min_p;                   /* [0, 1] */
    double presence_penalty;
    double frequency_penalty;
    double repetition_penalty;      /* 1 = off */
    uint64_t seed;
    bool has_seed;
} vlmd_sampling;

/* An image's place in a prompt, once the visual worker encoded it. */
typedef struct vlmd_image_ref {
    uint8_t hash[32];               /* content hash of the encoded image bytes */
    uint32_t token_offset;          /* index of its first <|image_pad|> in the prompt */
    uint32_t token_count;           /* image tokens (grid_h * grid_w / merge^2) */
    uint64_t arena_offset;          /* where its embeddings start in the shared arena */
    uint32_t grid_t, grid_h, grid_w;
    uint8_t *data;                  /* frontend -> router only: the encoded image (optional) */
    uint32_t n_data;
} vlmd_image_ref;

/* A request's bias on one token's logit (OpenAI's logit_bias). */
typedef struct vlmd_logit_bias {
    uint32_t id;
    double bias;                    /* [-100, 100], added to the logit before sampling */
} vlmd_logit_bias;

/* A request's grammar: its kind and text (not NUL-terminated), and where it
 * starts: at the first output token, or at the output's token `trigger`
 * (the token is free text; the grammar holds what follows it), counted only
 * once `trigger_after` has been generated when that is not -1 (a thinking
 * model's </think>: a trigger inside the reasoning does not count). */
typedef struct vlmd_request_grammar {
    uint32_t kind;                  /* vlmd_grammar_kind; NONE: free text */
    char *text;                     /* n_text bytes, at most VLMD_PROTO_MAX_GRAMMAR_BYTES */
    uint32_t n_text;
    int64_t trigger;                /* -1: from the first token; else a token id */
    int64_t trigger_after;          /* -1: none; else a token id */
} vlmd_request_grammar;

/* What a request asks of its prompt: tokens, or one pass over it (prefill
 * only, no sampling, its KV given back): the final norm's output at its last
 * position (an embedding model's last-token pooling), or the logits there of
 * a few ids (a reranker's yes / no). */
typedef enum vlmd_pooling {
    VLMD_POOL_NONE = 0,
    VLMD_POOL_LAST_HIDDEN,
    VLMD_POOL_LOGITS,
    VLMD_POOL_COUNT
} vlmd_pooling;

typedef struct vlmd_msg_request_submit {
    uint64_t req_id;
    uint32_t *tokens;               /* prompt token ids */
    uint32_t n_tokens;
    uint32_t max_tokens;
    vlmd_sampling sampling;
    uint32_t *stop_tokens;          /* extra token ids that end generation */
    uint32_t n_stop_tokens;
    uint32_t top_logprobs;          /* 0 to VLMD_MAX_TOP_LOGPROBS; 0 = no logprobs */
    bool logprobs;
    vlmd_image_ref *images;
    uint32_t n_images;
    char *session;                  /* X-Session-ID, "" when none (optional) */
    bool ignore_eos;                /* the model's end-of-sequence token does not end it (optional) */
    vlmd_logit_bias *logit_bias;    /* distinct ids (optional) */
    uint32_t n_logit_bias;
    uint32_t min_tokens;            /* EOS and stop tokens are banned before this many (optional) */
    vlmd_request_grammar grammar;   /* constrained decoding (optional: kind NONE) */
    uint32_t pooling;               /* vlmd_pooling: NONE generates (optional) */
    uint32_t *pool_ids;             /* POOL_LOGITS: the token ids whose last-position logits
                                     * are the answer (a reranker's no, yes) (optional) */
    uint32_t n_pool_ids;
} vlmd_msg_request_submit;

typedef struct vlmd_msg_request_cancel {
    uint64_t req_id;
    uint32_t reason;                /* vlmd_finish_reason, usually CANCELLED */
} vlmd_msg_request_cancel;

typedef struct vlmd_msg_token_chunk {
    uint64_t req_id;
    uint32_t *tokens;               /* tokens generated since the last chunk */
    uint32_t n_tokens;
    float *logprobs;                /* one per token when asked, else NULL */
    uint32_t n_logprobs;
    uint32_t finish;                /* vlmd_finish_reason; NONE while running */
    uint32_t status;                /* vlmd_status when finish == ERROR */
    char *message;                  /* error text when finish == ERROR, else "" */
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    uint32_t top_n;                 /* alternatives per token (0 to VLMD_MAX_TOP_LOGPROBS) */
    uint32_t *top_ids;              /* n_tokens x top_n, most likely first */
    uint32_t n_top_ids;
    float *top_logprobs;            /* n_tokens x top_n */
    uint32_t n_top_logprobs;
    uint32_t error_image;           /* finish == ERROR because of image i: i + 1; else 0 */
    uint32_t max_tokens_capped;     /* the router capped max_tokens to this (under pressure); 0 */
    uint32_t engine;                /* router -> frontend: the engine that answered (--data-parallel-rank) */
    uint32_t grammar_closed;        /* 1: the finish came after max_tokens' nearness steered the
                                     * output to its grammar's shortest completion */
    float *pooled;                  /* a pooling request's answer (its finish chunk) */
    uint32_t n_pooled;
} vlmd_msg_token_chunk;

typedef struct vlmd_msg_image_job {
    uint64_t req_id;
    uint32_t image_index;           /* position among the request's images */
    uint8_t hash[32];
    uint8_t *data;                  /* encoded image (PNG/JPEG/WebP) */
    uint32_t n_data;
    uint32_t width, height;         /* from the header, already checked */
    uint64_t arena_offset;          /* where the embeddings go in the shared arena */
    uint32_t token_count;           /* image tokens the requester counted (must agree) */
} vlmd_msg_image_job;

typedef struct vlmd_msg_image_result {
    uint64_t req_id;
    uint32_t image_index;
    uint32_t status;                /* vlmd_status; VLMD_OK when encoded */
    char *message;                  /* error text, "" when ok */
    vlmd_image_ref image;
    uint64_t embed_bytes;           /* size of the embeddings in the arena */
} vlmd_msg_image_result;

typedef struct vlmd_msg {
    vlmd_msg_type type;
    union {
        vlmd_msg_hello hello;
        vlmd_msg_welcome welcome;
        vlmd_msg_ready ready;
        vlmd_msg_heartbeat heartbeat;
        vlmd_msg_footprint_request footprint_request;
        vlmd_msg_footprint_reply footprint_reply;
        vlmd_msg_worker_exit worker_exit;
        vlmd_msg_stats_snapshot stats_snapshot;
        vlmd_msg_shutdown shutdown;
        vlmd_msg_request_submit request_submit;
        vlmd_msg_request_cancel request_cancel;
        vlmd_msg_token_chunk token_chunk;
        vlmd_msg_image_job image_job;
        vlmd_msg_image_result image_result;
        vlmd_msg_restarts restarts;
        vlmd_msg_group_id group_id;
    } u;
} vlmd_msg;

/* A deep copy of n entries (NULL when n is 0); fatal when out of memory. */
vlmd_kv *vlmd_kv_dup(const vlmd_kv *kv, uint32_t n);
/* The value of key among kv[0..n), or NULL. */
const char *vlmd_kv_get(const vlmd_kv *kv, uint32_t n, const char *key);
/* Frees a copy from vlmd_kv_dup (or a decoded map); accepts NULL. */
void vlmd_kv_free(vlmd_kv *kv, uint32_t n);

/* Appends the encoding of msg to out (borrows msg). Fails on a NULL array
 * with a nonzero count, a value over the limits, or allocation failure. */
vlmd_status vlmd_msg_encode(const vlmd_msg *msg, vlmd_buf *out, vlmd_error *err);

/* Decodes len bytes into *out (all of it owned by out afterwards). On any
 * failure *out is zeroed, nothing is leaked, and err names the problem. */
vlmd_status vlmd_msg_decode(const void *data, size_t len, vlmd_msg *out, vlmd_error *err);

/* Frees what a decode allocated; accepts NULL and zeroed messages. Only for
 * messages from vlmd_msg_decode (built-by-hand messages own nothing). */
void vlmd_msg_free(vlmd_msg *msg);

/* Moves src into *dst (which owns nothing yet) and leaves src zeroed. */
void vlmd_msg_take(vlmd_msg *dst, vlmd_msg *src);

#endif
