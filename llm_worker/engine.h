/* engine.h - continuous batching over the Qwen2 model.
 *
 * Requests are submitted at any time and join the running batch at the next
 * step; one step runs the prompts of newly admitted requests (prefill) and
 * one token of every running request (decode) in the same forward pass;
 * a finished request frees its KV slots at once.
 *
 * Request states (one thread, the engine's caller, owns them):
 *
 *     submit --> WAITING --admitted--> RUNNING --eos/stop/max--> (finished, freed)
 *        |          ^                     |
 *        |          +------preempted------+  (KV slots given back; recomputed on return)
 *        \--> refused (the prompt cannot fit the cache, or prompt + max_tokens
 *             exceeds the model length)
 *
 * KV accounting: admission (the router's estimate of the running set's peak,
 * docs/MEMORY.md §3) keeps preemption rare; the engine admits a waiting request
 * when its tokens fit the free slots now. When a step needs more slots than
 * are free, the newest running requests are paused and go back to the queue,
 * where they come before everything that arrived after them; recomputing
 * their tokens gives the tokens they would have produced. A request running
 * alone that still finds no slot ends with "length". A prompt longer than
 * what a step takes (or --chunked-prefill-size) is prefilled in chunks over
 * several steps, each attending to the chunks before it in the cache. With
 * the prefix cache a request starts from the longest cached prefix of its
 * tokens; finished and paused requests leave their KV to the cache, whose
 * unused entries are evicted, least recently used first, when slots run
 * short.
 *
 * A hybrid model (Qwen3.5) keeps, beside the KV, a state per running
 * request in a slot of its pool (max_running slots: admission never waits
 * for one); a paused request gives its slot back and recomputes. With the
 * prefix cache, a prefill also saves its state at the last multiple of 64
 * tokens before its end into a snapshot slot, and a request resumes from the
 * longest saved prefix of its tokens (state_snapshots.h): reuse is at those
 * points only. */
#ifndef VLMD_ENGINE_H
#define VLMD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_events.h"
#include "proto.h"
#include "lm.h"
#include "shm_arena.h"
#include "grammar_cache.h"
#include "structured.h"

typedef struct engine engine;

typedef struct engine_config {
    int32_t kv_slots;           /* tokens the KV cache holds */
    int32_t max_batch_tokens;   /* tokens per forward step */
    int32_t max_running;        /* requests decoding at once */
    int32_t eos_id;             /* ends generation (-1: none) */
    int32_t max_model_len;      /* prompt + output limit of one request */
    /* images (VL models): their pad token, the tower's merge size, and the
     * arena their embeddings are read from (borrowed; mapped by the caller
     * before it submits a request with images) */
    int32_t image_token_id;     /* -1: the model takes no images */
    int32_t merge_size;
    const vlmd_shm_arena *arena;
    bool prefix_cache;          /* reuse the KV of cached prefixes (prefix_cache.h) */
    int32_t chunk_tokens;       /* most prompt tokens of one request per step; 0: the budget */
    bool decode_graphs;         /* decode steps through captured graphs (lm_capture_decode) */
    /* KV events (kv_events.h; needs the prefix cache): its blocks of this
     * many tokens are logged as they are stored and removed; 0: off */
    int32_t event_block_size;
    uint64_t event_hash_root;   /* the block hash chain's root (kv_events_hash_init) */
    /* the tokenizer's tokens as bytes (borrowed; at most the model's vocabulary): what
     * grammars are matched against. NULL: a request with a grammar is refused */
    const vlmd_vocab *vocab;
    /* after every step, engine_check_invariants in any build (a pass over
     * every KV slot); a failure is logged, every request ends with an error
     * (VLMD_ERR_INTERNAL) and the KV cache is emptied, and serving goes on
     * (--check-invariants). false: only debug builds check, the books alone
     * (not who holds each slot), and a failure stops the process */
    bool check_invariants;
    /* the grammar cache's bound in bytes (grammar_cache.h; 0:
     * ENGINE_GRAMMAR_CACHE_BYTES): profile_grammar_cache_bytes sizes it */
    size_t grammar_cache_bytes;
} engine_config;

/* Compiled grammars the engine keeps for reuse (grammar_cache.h): at most
 * this many, and this many bytes (less on a small CPU device: the memory
 * plan counts it there, profile_grammar_cache_bytes). */
#define ENGINE_GRAMMAR_CACHE_ENTRIES 64
#define ENGINE_GRAMMAR_CACHE_BYTES ((size_t)1 << 30)
/* Constrained decoding near max_tokens: from the step where the tokens left
 * are at most this many more than the bytes that close the value
 * (vlmd_grammar_min_completion), the output follows its shortest completion,
 * one byte a token, so that it ends complete when there is room. */
#define ENGINE_GRAMMAR_CLOSE_MARGIN 16

/* Log-probabilities of a generated token under the model's distribution (the
 * raw logits' log-softmax, before penalties and temperature) and the most
 * likely alternatives, for requests that ask. */
typedef struct engine_logprobs {
    float logprob;
    uint32_t n_top;
    uint32_t top_ids[VLMD_MAX_TOP_LOGPROBS];
    float top_logprobs[VLMD_MAX_TOP_LOGPROBS];
} engine_logprobs;

/* What a step gives one request: its token (or none, when it ended for want
 * of KV room), how it finished, its counts. */
typedef struct engine_output {
    uint64_t req_id;
    const int32_t *tokens;
    int32_t n_tokens;
    vlmd_finish_reason finish;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens;             /* prompt tokens the prefix cache gave it */
    const engine_logprobs *logprobs;    /* one per token; NULL unless asked */
    const char *error;                  /* finish ERROR: why (borrowed for the call) */
    vlmd_status status;                 /* finish ERROR: what kind (VLMD_ERR_INVALID_ARG: the
                                         * request's grammar; _INTERNAL: the engine's books) */
    bool grammar_closed;                /* finished complete after max_tokens' nearness steered
                                         * it to its grammar's shortest completion */
    const float *pooled;                /* a pooling request's answer (borrowed for the call) */
    int32_t n_pooled;
} engine_output;

/* Called after every step for each request that produced tokens (or ended). */
typedef void (*engine_emit_fn)(const engine_output *out, void *ud);

/* Borrows the model; allocates the KV cache and the step workspace. */
vlmd_status engine_create(lm_model *m, const engine_config *cfg, engine_emit_fn emit, void *ud,
                          engine **out, vlmd_error *err);
void engine_free(engine *e);

/* Queues a request (the message is borrowed; what the engine needs is
 * copied). VLMD_ERR_TOO_LARGE when it could never fit the KV cache or the
 * model length; VLMD_ERR_INVALID_ARG on a token id outside the vocabulary,
 * an id already in use, or images that do not match their pad tokens, grids
 * or the arena. An image's embeddings are read from the arena at its offset
 * whenever its tokens are (re)computed, so they must stay there until the
 * request has ended. Image prompts get M-RoPE positions (mrope.h).
 *
 * A grammar (constrained decoding) is compiled here unless the cache has it
 * (a compile is bounded by structured.h's limits); one that does not compile
 * is VLMD_ERR_INVALID_ARG (or _TOO_LARGE) naming the place and the keyword,
 * as is a grammar with ignore_eos, with no end token (no eos_id and no
 * special stop token), a trigger outside the vocabulary, or an engine
 * without a vocab. While the grammar holds (from the first token, or from
 * its trigger token on), each step's mask lets through only tokens that
 * keep the output in it, and the end tokens (eos_id, the stop tokens that
 * are not text) only where it is complete, where they end it; a stop token
 * that is text is text there, held to the grammar, and min_tokens does not
 * hold (the grammar decides the end). Near max_tokens the output is steered to
 * close (ENGINE_GRAMMAR_CLOSE_MARGIN), and a complete one ends where more (a
 * second call) could not complete in the tokens left; a token the mask allowed that the
 * automaton then refuses (an ambiguous grammar past its state's size, the
 * one case) ends the request with finish ERROR and a message.
 *
 * A pooling request (r->pooling: vlmd_pooling) is one pass over its prompt:
 * once its last token is computed it ends (finish STOP, no token) with its
 * answer in engine_output.pooled: the final norm's output there (H floats),
 * or the logits there of its pool_ids (1 to VLMD_PROTO_MAX_POOL_IDS ids in
 * the vocabulary); one with a grammar is VLMD_ERR_INVALID_ARG. */
vlmd_status engine_submit(engine *e, const vlmd_msg_request_submit *r, vlmd_error *err);
/* Drops a request wherever it is; emits nothing. false when unknown. */
bool engine_cancel(engine *e, uint64_t req_id);
/* Drops every request (nobody waits for them any more); emits nothing.
 * Returns how many there were. */
int32_t engine_cancel_all(engine *e);
/* Runs one step when there is work; false when idle. */
vlmd_status engine_step(engine *e, bool *did_work, vlmd_error *err);

/* The backend bytes engine_create takes for cfg (KV cache and workspace),
 * found without allocating. Decode graphs are not in it: on CUDA their
 * memory is the driver's, which only running shows. */
uint64_t engine_device_bytes(lm_model *m, const engine_config *cfg);
/* A hybrid model's state slots under cfg: one per running request, and as
 * many snapshots (state_snapshots.h) where the prefix cache is on; 0 for
 * other models. */
int32_t engine_state_slots(const lm_model *m, const engine_config *cfg);
/* The hybrid model's snapshots saved and restored so far (0 for others). */
void engine_snapshot_counts(const engine *e, uint64_t *saved, uint64_t *restored);

/* What engine_stress runs through the model. */
typedef enum engine_stress_kind {
    ENGINE_STRESS_AUTO = 0,     /* FULL where ops take memory of their own (CUDA), else SHAPES */
    ENGINE_STRESS_FULL,         /* the worst step the configuration allows */
    ENGINE_STRESS_SHAPES,       /* a few tokens through every op: where ops take no memory
                                 * (vlmd_backend_ops_take_memory), the buffers engine_create
                                 * sized from the shapes are all any step uses */
} engine_stress_kind;

const char *engine_stress_str(engine_stress_kind k);
/* AUTO resolved for this backend. */
engine_stress_kind engine_stress_resolve(const vlmd_backend *b, engine_stress_kind k);

/* A step run for real on an idle engine, with the worst-case expert routing
 * (lm_set_worst_case_routing; normal routing again after), then the
 * sampler with every row asking for logprobs. FULL: a prefill of
 * max_batch_tokens tokens (capped at the KV slots; prompts of a few hundred
 * tokens each, at most max_running of them; a model that takes images gets
 * its first rows as an image's, DeepStack features included), then a decode step of
 * max_running sequences. SHAPES: a prefill of at most 16 tokens and a decode
 * step of at most 2 sequences. Leaves the cache's contents meaningless and
 * no request changed. The auto-profile measures the device's peak use with
 * it. VLMD_ERR_INVALID_ARG when the engine is not idle. */
vlmd_status engine_stress(engine *e, engine_stress_kind kind, vlmd_error *err);

/* The grammar cache's numbers (entries, bytes, hits, compiles...). */
void engine_grammar_stats(const engine *e, grammar_cache_stats *out);
/* The compiled grammars (NULL without a vocabulary): the worker puts there
 * what it compiled off the loop (grammar_jobs.h) before it submits. */
grammar_cache *engine_grammars(engine *e);

int32_t engine_free_slots(const engine *e);
/* Decode graphs captured, the largest batch they cover (0, 0 when eager),
 * and the steps that ran through one. */
int32_t engine_graph_count(const engine *e);
int32_t engine_graph_max_batch(const engine *e);
uint64_t engine_graph_steps(const engine *e);
/* The kernels a decode step of `rows` sequences launches through its graph
 * (-1: none captured for it, or not on a device). */
int engine_graph_kernels(const engine *e, int32_t rows);
int32_t engine_capacity(const engine *e);  /* KV slots in all */
int32_t engine_active(const engine *e); /* waiting + running */
int32_t engine_running(const engine *e);
uint64_t engine_preemptions(const engine *e); /* requests paused for KV room so far */
/* KV slots requests hold now (the prefix cache's unused entries not counted). */
int32_t engine_kv_in_use(const engine *e);

typedef struct engine_cache_info {
    uint64_t prompt_tokens, cached_tokens;  /* of admitted prompts so far: the hit rate */
    int32_t tokens, evictable;              /* the cache now */
    int32_t blocks;                         /* its event blocks (0 when events are off) */
    uint64_t generated_tokens;              /* tokens sampled so far (recomputations not counted) */
} engine_cache_info;
void engine_cache_stats(const engine *e, engine_cache_info *out);

/* The KV events logged since the caller last emptied the log (NULL when
 * they are off); read it between steps only. */
kv_event_log *engine_events(engine *e);
/* The hashes of the event blocks the cache holds (at most max, into out);
 * returns how many. */
int32_t engine_event_blocks(const engine *e, uint64_t *out, int32_t max);

/* The invariant schedule() keeps between steps (stated at its top in
 * engine.c): each request's n_cached, n_shared and lock agree with its
 * state; the list's counts; the prefix cache's locked paths are the
 * requests' locks and hold their shared slots; every KV slot is held
 * exactly once, by the free list, the prefix cache or one request's own
 * range. VLMD_ERR_INTERNAL with what disagrees in err. Allocates nothing and
 * writes only a scratch sized at engine_create: O(requests + KV slots +
 * prefix-cache nodes + the running requests' cached tokens), less than a
 * step's attention reads. Call it between steps (not from an emit
 * callback). See engine_config.check_invariants. */
vlmd_status engine_check_invariants(const engine *e, vlmd_error *err);
/* Times a failed check reset the engine (check_invariants only). */
uint64_t engine_invariant_resets(const engine *e);
/* Tests only: breaks the books on purpose, so that a test sees the check
 * fail and the engine recover. leak: a free slot is lost (the sums then
 * disagree); otherwise the free list's next slot becomes one that a running
 * request holds as its own (the sums agree; one slot is held twice). false
 * when it cannot (no free slot; no running request with a slot of its own). */
bool engine_test_break_books(engine *e, bool leak);

#endif
