/* engine.c - the scheduler and step loop (see engine.h for the states).
 *
 * Constrained decoding: a request with a grammar holds a compiled grammar of
 * the cache (shared) and its own automaton state, which lives with the
 * request and so survives preemption (recomputing KV changes no token). Each
 * step, after the forward pass is launched (the masks are host work that
 * overlaps a device's), every sampling row whose grammar holds gets its
 * token mask, which the sampler applies; after sampling the token advances
 * the state. Phases of a request's grammar:
 *
 *     ARMING --trigger_after--> WAITING --trigger--> ACTIVE --end token--> finished
 *     (no trigger_after: starts WAITING; no trigger: starts ACTIVE)
 *
 * Before ACTIVE the output is free text and ends as any other. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_events.h"
#include "kv_slots.h"
#include "log.h"
#include "mrope.h"
#include "prefix_cache.h"
#include "state_snapshots.h"

typedef enum req_state { REQ_WAITING, REQ_RUNNING } req_state;

/* Where a request's grammar is (see the file comment). */
typedef enum grammar_phase { GRAMMAR_OFF, GRAMMAR_ARMING, GRAMMAR_WAITING, GRAMMAR_ACTIVE } grammar_phase;
#define STRESS_SHAPES_TOKENS 16 /* the SHAPES stress's prefill, */
#define STRESS_SHAPES_SEQS 2    /* and its decode step's sequences */

#define STRESS_PROMPT 256 /* tokens per prompt of engine_stress's prefill (at least) */
#define STRESS_IMAGE 16   /* rows of it that take an image's input, for a VL model */

/* An image of a prompt: its tokens' rows in the arena. */
typedef struct req_image {
    int32_t start, count;       /* its pad tokens in the prompt */
    const float *data;          /* count x hidden embeddings, then (Qwen3-VL) each DeepStack
                                 * feature's count x hidden, in the arena (borrowed) */
} req_image;

/* Prefix-cache keys of an image's tokens: pseudo ids from its content hash,
 * above every vocabulary id, so that only the same image matches. */
#define IMAGE_KEY_BIT 0x80000000u

typedef struct request {
    uint64_t id;
    req_state state;
    int32_t *tokens;            /* prompt then output; capacity n_prompt + max_tokens */
    int32_t n_prompt, n_tokens;
    int32_t *slots;             /* the request -> token table: slot of each cached token */
    int32_t n_cached;
    uint32_t *keys;             /* the prefix cache's key of each token (ids; images: pseudo ids) */
    int32_t n_shared;           /* slots[0..n_shared) belong to the prefix cache (locked) */
    pc_node *lock;              /* the cached prefix it locked, or NULL */
    int32_t state_slot;         /* a hybrid model's: its state slot while RUNNING (-1: none) */
    int32_t restore_from;       /* the snapshot its state starts from when admitted (-1: none) */
    int32_t snapshot_at;        /* where its prefill saves a snapshot (0: nowhere) */
    uint32_t cached_tokens;     /* prompt tokens the cache gave at its first admission */
    bool admitted;              /* admitted at least once (preemption re-admits) */
    int32_t max_tokens;
    vlmd_sampling sampling;
    bool logprobs;
    bool ignore_eos;            /* eos_id does not end it */
    uint32_t top_logprobs;
    uint32_t stop[VLMD_PROTO_MAX_STOPS];
    uint32_t n_stop;
    vlmd_logit_bias *bias;      /* logit_bias, distinct ids */
    uint32_t n_bias;
    int32_t min_tokens;         /* its end tokens are banned until it has made this many */
    uint64_t seed;              /* its random stream (sample_rng.h): the seed, or its id */
    req_image *images;          /* in prompt order; NULL for text */
    uint32_t n_images;
    int32_t *mrope;             /* [3][n_prompt] positions of an image prompt; NULL for text */
    int32_t rope_delta;         /* beyond the prompt: position of token i is i + rope_delta */
    /* KV events only: the hash of each event block of its tokens computed so
     * far ([n_hashed] of (n_prompt + max_tokens) / B), its images' ids */
    uint64_t *block_hash;
    int32_t n_hashed;
    kv_image_span *spans;
    /* constrained decoding (GRAMMAR_OFF: free text) */
    grammar_entry *grammar;     /* held from the cache */
    vlmd_grammar_state *gstate; /* where its output is in the grammar (owned) */
    grammar_phase gphase;
    int32_t trigger, trigger_after;         /* the phases' tokens (-1: none) */
    uint32_t end_ids[VLMD_PROTO_MAX_STOPS + 1]; /* eos_id and the stop tokens */
    uint32_t n_end;
    bool mask_failed;           /* this step's mask could not be made: it ends in an error */
    bool closing;               /* near max_tokens, its output was steered to its grammar's
                                 * shortest completion (fill_mask) */
    vlmd_pooling pooling;       /* NONE: it generates; else one pass, its answer pooled */
    uint32_t pool_ids[VLMD_PROTO_MAX_POOL_IDS];
    uint32_t n_pool_ids;
    float *answer;              /* its pooled answer, taken before the step's sampling (which
                                 * works on the logits in place) and emitted after */
    int32_t n_answer;
    bool listed;                /* on the engine's list (request_free refuses it then) */
    struct request *next;       /* in arrival order */
} request;

struct engine {
    lm_model *m;
    engine_config cfg;
    engine_emit_fn emit;
    void *ud;
    lm_kv *kv;
    lm_workspace *ws;
    kv_slots slots;
    /* a hybrid model's state pool: one slot per running request (max_running of
     * them, so admission never waits for one), the free ones a stack */
    bool hybrid;
    int32_t *state_free, n_state_free;
    int32_t *seq_state;         /* the state slot of each attention sequence of the step */
    state_snapshots snapshots;  /* with the prefix cache: slots [max_running, 2 max_running) */
    prefix_cache *cache;        /* NULL when disabled */
    request *head, *tail;       /* every request, in arrival order; the only list that owns
                                 * them (request_end takes one off and frees it) */
    int32_t n_running, n_active;
    uint64_t preemptions;
    uint64_t prompt_tokens, cached_tokens; /* over first admissions: the cache's hit rate */
    uint64_t generated_tokens;
    bool events_on;             /* the cache's changes are logged in `events` */
    kv_event_log events;
    /* one step's views of the list (borrowed, valid during the step only; an entry
     * whose request ended in the step is never read again) */
    request **running;          /* one step's running requests, oldest first [max_running] */
    request **seq_req;          /* the request of each attention sequence of the step */
    /* one step's batch, sized for max_batch_tokens */
    int32_t *ids, *positions, *step_slots, *logit_rows;
    vlmd_attn_seq *seqs;
    lm_embed_run *embeds;    /* image rows of the step, at most max_running x images each */
    int32_t n_embeds;
    request **in_step;
    /* sampling: each logit row's parameters and result, the seen tokens of
     * all rows, and a vocabulary-sized map (0: not listed yet) that builds them */
    vlmd_sample_row *sample_rows;
    vlmd_sample_out *sample_out;
    vlmd_seen_token *seen;
    int32_t *seen_at;
    /* constrained decoding: the grammars, one host mask per logit row (NULL for a
     * free row), a fill's scratch, and the token that is each byte alone (-1: none) */
    grammar_cache *grammars;    /* NULL without a vocabulary */
    size_t mask_words;
    uint32_t *masks;
    const uint32_t **row_masks;
    vlmd_mask_scratch *scratch;
    int32_t byte_token[256];
    uint8_t *slot_owner;        /* engine_check_invariants' scratch: who holds each slot */
    uint64_t resets;            /* reset_books after a failed check (--check-invariants) */
};

/* ---- lifetime ----------------------------------------------------------------- */

/* The prefix cache evicted these blocks. */
static void blocks_removed(const uint64_t *hashes, int32_t n, void *ud)
{
    engine *e = ud;
    kv_event_removed(&e->events, hashes, n);
}

/* The grammar cache, the step's masks, and the single-byte tokens that
 * steer an output to its end (ENGINE_GRAMMAR_CLOSE_MARGIN). */
static vlmd_status grammars_init(engine *e, const vlmd_vocab *v, vlmd_error *err)
{
    if (vlmd_vocab_size(v) > e->mask_words * 32)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "the tokenizer has %u tokens, more than the "
                           "model's vocabulary of %u", vlmd_vocab_size(v),
                           lm_vocab_size(e->m));
    e->masks = malloc((size_t)e->cfg.max_running * e->mask_words * sizeof *e->masks);
    e->scratch = vlmd_mask_scratch_create();
    if (!e->masks || !e->scratch)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for token masks");
    for (int b = 0; b < 256; b++)
        e->byte_token[b] = -1;
    for (uint32_t id = vlmd_vocab_size(v); id-- > 0;) { /* the lowest id wins */
        const uint8_t *bytes;
        size_t n;
        if (vlmd_vocab_token(v, id, &bytes, &n) && n == 1)
            e->byte_token[bytes[0]] = (int32_t)id;
    }
    size_t bound = e->cfg.grammar_cache_bytes ? e->cfg.grammar_cache_bytes
                                              : ENGINE_GRAMMAR_CACHE_BYTES;
    return grammar_cache_create(v, ENGINE_GRAMMAR_CACHE_ENTRIES, bound, &e->grammars, err);
}

/* A sequence is never longer than the model length or the cache. */
static int32_t max_kv_len(const engine_config *cfg)
{
    return cfg->max_model_len < cfg->kv_slots ? cfg->max_model_len : cfg->kv_slots;
}

int32_t engine_state_slots(const lm_model *m, const engine_config *cfg)
{
    return lm_is_hybrid(m) ? cfg->max_running * (cfg->prefix_cache ? 2 : 1) : 0;
}

void engine_snapshot_counts(const engine *e, uint64_t *saved, uint64_t *restored)
{
    *saved = e->snapshots.saved;
    *restored = e->snapshots.restored;
}

uint64_t engine_device_bytes(lm_model *m, const engine_config *cfg)
{
    return lm_kv_bytes(m, cfg->kv_slots) + lm_state_bytes(m, engine_state_slots(m, cfg)) +
           lm_workspace_bytes(m, cfg->max_batch_tokens, cfg->max_running, max_kv_len(cfg));
}

vlmd_status engine_create(lm_model *m, const engine_config *cfg, engine_emit_fn emit, void *ud,
                          engine **out, vlmd_error *err)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    e->m = m;
    e->cfg = *cfg;
    if (e->cfg.eos_id >= (int32_t)lm_vocab_size(m))
        e->cfg.eos_id = -1; /* a config's id the model cannot produce ends nothing */
    e->emit = emit;
    e->ud = ud;
    int32_t n = cfg->max_batch_tokens, r = cfg->max_running, V = (int32_t)lm_vocab_size(m);
    /* A hybrid model's cached prefix has no recurrent state to resume from:
     * its prefixes are recomputed (the caller says so where it asked) */
    e->hybrid = lm_is_hybrid(m);
    int32_t states = engine_state_slots(m, cfg);
    vlmd_status s = state_snapshots_init(&e->snapshots, states ? states - r : 0, r, err);
    if (s == VLMD_OK)
        s = kv_slots_init(&e->slots, cfg->kv_slots, err);
    if (s == VLMD_OK && e->cfg.prefix_cache)
        s = prefix_cache_create(&e->slots, &e->cache, err);
    if (s == VLMD_OK && e->cache && cfg->event_block_size > 0) {
        e->events_on = true;
        kv_event_log_init(&e->events, cfg->event_block_size);
        prefix_cache_track_blocks(e->cache, cfg->event_block_size, blocks_removed, e);
    }
    if (s == VLMD_OK)
        s = lm_kv_create_hybrid(m, cfg->kv_slots, states, &e->kv, err);
    if (s == VLMD_OK)
        s = lm_workspace_create(m, n, r, max_kv_len(cfg), &e->ws, err);
    if (s == VLMD_OK && cfg->decode_graphs)
        s = lm_capture_decode(m, e->kv, e->ws, err);
    e->ids = malloc((size_t)n * sizeof *e->ids);
    e->positions = malloc(3 * (size_t)n * sizeof *e->positions);
    e->step_slots = malloc((size_t)n * sizeof *e->step_slots);
    e->logit_rows = malloc((size_t)r * sizeof *e->logit_rows);
    e->seqs = malloc((size_t)r * sizeof *e->seqs);
    e->embeds = malloc((size_t)r * VLMD_PROTO_MAX_IMAGES * sizeof *e->embeds);
    e->in_step = malloc((size_t)r * sizeof *e->in_step);
    e->running = malloc((size_t)r * sizeof *e->running);
    e->seq_req = malloc((size_t)r * sizeof *e->seq_req);
    e->seq_state = malloc((size_t)r * sizeof *e->seq_state);
    e->state_free = malloc((size_t)r * sizeof *e->state_free);
    for (int32_t i = 0; e->state_free && e->hybrid && i < r; i++)
        e->state_free[e->n_state_free++] = r - 1 - i; /* slot 0 on top */
    e->sample_rows = malloc((size_t)r * sizeof *e->sample_rows);
    e->sample_out = malloc((size_t)r * sizeof *e->sample_out);
    e->seen = s == VLMD_OK ? malloc((size_t)lm_seen_capacity(e->ws) * sizeof *e->seen) : NULL;
    e->seen_at = calloc((size_t)V, sizeof *e->seen_at);
    e->mask_words = lm_mask_words(m);
    e->row_masks = calloc((size_t)r, sizeof *e->row_masks);
    e->slot_owner = malloc(cfg->kv_slots > 0 ? (size_t)cfg->kv_slots : 1);
    if (s == VLMD_OK && (!e->ids || !e->positions || !e->step_slots || !e->logit_rows ||
                         !e->seqs || !e->embeds || !e->in_step || !e->running || !e->seq_req ||
                         !e->seq_state || !e->state_free ||
                         !e->sample_rows || !e->sample_out || !e->seen || !e->seen_at ||
                         !e->row_masks || !e->slot_owner))
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the engine's batch");
    if (s == VLMD_OK && cfg->vocab)
        s = grammars_init(e, cfg->vocab, err);
    if (s != VLMD_OK) {
        engine_free(e);
        return s;
    }
    *out = e;
    return VLMD_OK;
}

static void request_end(engine *e, request *q);

/* Frees a request that is on no list: one engine_submit refused, or one
 * request_end took off the list (the only two callers). */
static void request_free(engine *e, request *q)
{
    VLMD_ASSERT(!q->listed);
    free(q->block_hash);
    free(q->spans);
    if (q->grammar)
        grammar_cache_release(e->grammars, q->grammar);
    free(q->gstate);
    free(q->tokens);
    free(q->slots);
    free(q->keys);
    free(q->images);
    free(q->mrope);
    free(q->bias);
    free(q->answer);
    free(q);
}

void engine_free(engine *e)
{
    if (!e)
        return;
    while (e->head) /* (their KV goes to the cache, which gives it all back below) */
        request_end(e, e->head);
    grammar_cache_free(e->grammars);
    vlmd_mask_scratch_free(e->scratch);
    free(e->masks);
    free(e->row_masks);
    lm_workspace_free(e->m, e->ws);
    lm_kv_free(e->m, e->kv);
    prefix_cache_free(e->cache);
    kv_event_log_free(&e->events);
    kv_slots_free(&e->slots);
    free(e->ids);
    free(e->positions);
    free(e->step_slots);
    free(e->logit_rows);
    free(e->seqs);
    free(e->embeds);
    free(e->in_step);
    free(e->running);
    free(e->seq_req);
    free(e->seq_state);
    free(e->state_free);
    state_snapshots_free(&e->snapshots);
    free(e->sample_rows);
    free(e->sample_out);
    free(e->seen);
    free(e->seen_at);
    free(e->slot_owner);
    free(e);
}

grammar_cache *engine_grammars(engine *e)
{
    return e->grammars;
}

void engine_grammar_stats(const engine *e, grammar_cache_stats *out)
{
    if (e->grammars)
        grammar_cache_get_stats(e->grammars, out);
    else
        *out = (grammar_cache_stats){0};
}

int32_t engine_free_slots(const engine *e)
{
    return e->slots.n_free;
}

int32_t engine_graph_count(const engine *e)
{
    return lm_decode_graph_count(e->ws);
}

uint64_t engine_graph_steps(const engine *e)
{
    return lm_decode_graph_steps(e->ws);
}

int32_t engine_graph_max_batch(const engine *e)
{
    return lm_decode_graph_max(e->ws);
}

int engine_graph_kernels(const engine *e, int32_t rows)
{
    return lm_decode_graph_kernels(e->ws, rows);
}

int32_t engine_capacity(const engine *e)
{
    return e->slots.capacity;
}

int32_t engine_active(const engine *e)
{
    return e->n_active;
}

int32_t engine_running(const engine *e)
{
    return e->n_running;
}

uint64_t engine_preemptions(const engine *e)
{
    return e->preemptions;
}

void engine_cache_stats(const engine *e, engine_cache_info *out)
{
    *out = (engine_cache_info){e->prompt_tokens, e->cached_tokens,
                               e->cache ? prefix_cache_tokens(e->cache) : 0,
                               e->cache ? prefix_cache_evictable(e->cache) : 0,
                               e->cache ? prefix_cache_blocks(e->cache) : 0,
                               e->generated_tokens};
}

kv_event_log *engine_events(engine *e)
{
    return e->events_on ? &e->events : NULL;
}

int32_t engine_event_blocks(const engine *e, uint64_t *out, int32_t max)
{
    return e->cache ? prefix_cache_block_hashes(e->cache, out, max) : 0;
}

int32_t engine_kv_in_use(const engine *e)
{
    return e->slots.capacity - e->slots.n_free -
           (e->cache ? prefix_cache_evictable(e->cache) : 0);
}

uint64_t engine_invariant_resets(const engine *e)
{
    return e->resets;
}

bool engine_test_break_books(engine *e, bool leak)
{
    if (e->slots.n_free == 0)
        return false;
    if (leak) {
        e->slots.n_free--;
        return true;
    }
    for (request *q = e->head; q; q = q->next)
        if (q->state == REQ_RUNNING && q->n_cached > q->n_shared) {
            e->slots.free[e->slots.n_free - 1] = q->slots[q->n_shared];
            return true;
        }
    return false;
}

/* ---- the invariant (stated at the top of schedule()) ---------------------------- */

/* Who holds a slot, in engine_check_invariants' scratch. */
enum { SLOT_NOBODY, SLOT_FREE, SLOT_CACHE, SLOT_REQUEST };

typedef struct slot_marks {
    uint8_t *owner;
    int32_t capacity;
    bool broken;                /* a slot out of range or held twice was found: */
    int32_t bad;                /* the first */
    uint8_t as;                 /* what marks are made now */
} slot_marks;

static void mark_slots(const int32_t *slots, int32_t n, void *ud)
{
    slot_marks *m = ud;
    for (int32_t i = 0; i < n && !m->broken; i++) {
        int32_t s = slots[i];
        if (s < 0 || s >= m->capacity || m->owner[s] != SLOT_NOBODY)
            m->broken = true, m->bad = s;
        else
            m->owner[s] = m->as;
    }
}

static const char *slot_owner_str(uint8_t who)
{
    switch (who) {
    case SLOT_FREE:
        return "the free list";
    case SLOT_CACHE:
        return "the prefix cache";
    case SLOT_REQUEST:
        return "a request";
    }
    return "nobody";
}

/* One request's part of the invariant; *held gets its private slots. */
static vlmd_status check_request(const engine *e, const request *q, int64_t *held,
                                 vlmd_error *err)
{
    unsigned long long id = (unsigned long long)q->id;
    *held = 0;
    if (!q->listed)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "request %llu is on the list unmarked", id);
    if ((q->state == REQ_RUNNING) != (q->state_slot >= 0) && e->hybrid)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "request %llu (%s) holds state slot %d", id,
                           q->state == REQ_RUNNING ? "running" : "waiting", q->state_slot);
    if (q->state == REQ_WAITING) {
        if (q->n_cached || q->n_shared || q->lock)
            return vlmd_errorf(err, VLMD_ERR_INTERNAL, "waiting request %llu holds KV "
                               "(n_cached %d, n_shared %d, lock %s)", id, q->n_cached,
                               q->n_shared, q->lock ? "set" : "none");
        return VLMD_OK;
    }
    if (q->state != REQ_RUNNING)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "request %llu is in state %d", id,
                           (int)q->state);
    if (q->n_shared < 0 || q->n_shared > q->n_cached || q->n_cached >= q->n_tokens ||
        q->n_tokens > q->n_prompt + q->max_tokens)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "running request %llu: want 0 <= n_shared "
                           "%d <= n_cached %d < n_tokens %d <= prompt %d + max_tokens %d", id,
                           q->n_shared, q->n_cached, q->n_tokens, q->n_prompt, q->max_tokens);
    if ((q->lock != NULL) != (q->n_shared > 0) || (q->lock && !e->cache))
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "running request %llu: n_shared %d with "
                           "lock %s%s", id, q->n_shared, q->lock ? "set" : "none",
                           e->cache ? "" : " and no prefix cache");
    if (q->lock && prefix_cache_path_len(q->lock) != q->n_shared)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "running request %llu shares %d tokens; its "
                           "locked path holds %d", id, q->n_shared,
                           prefix_cache_path_len(q->lock));
    if (q->lock && !prefix_cache_path_has_slots(q->lock, q->slots))
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "running request %llu: its shared slots "
                           "are not its locked path's", id);
    *held = q->n_cached - q->n_shared;
    return VLMD_OK;
}

/* The invariant's books, O(requests): the list, the counts, each request's
 * part, the locks and the sum of the KV slots (not who holds each one). */
static vlmd_status check_books(const engine *e, vlmd_error *err)
{
    int32_t cap = e->slots.capacity, n_free = e->slots.n_free;
    int32_t cached = e->cache ? prefix_cache_tokens(e->cache) : 0;
    int32_t active = 0, running = 0, locks = 0;
    int64_t held = 0;
    const request *last = NULL;
    for (const request *q = e->head; q; last = q, q = q->next) {
        int64_t h;
        vlmd_status st = check_request(e, q, &h, err);
        if (st != VLMD_OK)
            return st;
        active++;
        running += q->state == REQ_RUNNING;
        locks += q->lock != NULL;
        held += h;
    }
    if (last != e->tail || active != e->n_active || running != e->n_running ||
        running > e->cfg.max_running)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "the list holds %d requests, %d running "
                           "(counted %d and %d, at most %d running; tail %s)", active, running,
                           e->n_active, e->n_running, e->cfg.max_running,
                           last == e->tail ? "right" : "wrong");
    if (e->hybrid && running + e->n_state_free != e->cfg.max_running)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "the state pool: %d running + %d free != "
                           "its %d slots", running, e->n_state_free, e->cfg.max_running);
    if (e->cache && prefix_cache_locks(e->cache) != locks)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "the prefix cache has %d locked paths; "
                           "requests hold %d", prefix_cache_locks(e->cache), locks);
    if (n_free < 0 || held + n_free + cached != cap)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "the KV books: %lld held by requests + %d "
                           "free + %d cached != the capacity %d", (long long)held, n_free,
                           cached, cap);
    return VLMD_OK;
}

vlmd_status engine_check_invariants(const engine *e, vlmd_error *err)
{
    vlmd_status st = check_books(e, err);
    if (st != VLMD_OK)
        return st;
    int32_t cap = e->slots.capacity, n_free = e->slots.n_free;
    /* the sums agree, so no slot held twice (nor out of range) means each is held once */
    slot_marks m = {e->slot_owner, cap, false, 0, SLOT_FREE};
    memset(m.owner, SLOT_NOBODY, (size_t)cap);
    mark_slots(e->slots.free, n_free, &m);
    m.as = SLOT_CACHE;
    if (e->cache && !m.broken)
        prefix_cache_visit_slots(e->cache, mark_slots, &m);
    m.as = SLOT_REQUEST;
    for (const request *q = e->head; q && !m.broken; q = q->next)
        if (q->state == REQ_RUNNING)
            mark_slots(q->slots + q->n_shared, q->n_cached - q->n_shared, &m);
    if (m.broken && (m.bad < 0 || m.bad >= cap))
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "KV slot %d held by %s is outside the "
                           "capacity %d", m.bad, slot_owner_str(m.as), cap);
    if (m.broken)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "KV slot %d is held twice: by %s, then "
                           "by %s", m.bad, slot_owner_str(m.owner[m.bad]), slot_owner_str(m.as));
    return VLMD_OK;
}

const char *engine_stress_str(engine_stress_kind k)
{
    switch (k) {
    case ENGINE_STRESS_AUTO:
        return "auto";
    case ENGINE_STRESS_FULL:
        return "full";
    case ENGINE_STRESS_SHAPES:
        return "shapes";
    }
    return "unknown";
}

/* Only a run measures what ops take beyond their buffers; where they take
 * nothing, the shapes are the whole reservation and the worst step costs
 * only time (minutes of a 4096-token prefill on a CPU). */
engine_stress_kind engine_stress_resolve(const vlmd_backend *b, engine_stress_kind k)
{
    if (k != ENGINE_STRESS_AUTO)
        return k;
    return vlmd_backend_ops_take_memory(b) ? ENGINE_STRESS_FULL : ENGINE_STRESS_SHAPES;
}

vlmd_status engine_stress(engine *e, engine_stress_kind kind, vlmd_error *err)
{
    if (e->n_active)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "the stress runs on an idle engine only");
    int32_t n = e->cfg.max_batch_tokens < e->cfg.kv_slots ? e->cfg.max_batch_tokens
                                                          : e->cfg.kv_slots;
    int32_t r = e->cfg.max_running < n ? e->cfg.max_running : n;
    if (engine_stress_resolve(lm_backend(e->m), kind) == ENGINE_STRESS_SHAPES) {
        n = n < STRESS_SHAPES_TOKENS ? n : STRESS_SHAPES_TOKENS;
        r = r < STRESS_SHAPES_SEQS ? r : STRESS_SHAPES_SEQS;
    }
    int32_t V = (int32_t)lm_vocab_size(e->m);
    /* n prompt tokens in slots 0..n-1, as prompts of up to STRESS_PROMPT tokens
     * (the step's memory depends on its rows, not on how they split into
     * sequences; short ones keep the CPU's attention quick) */
    int32_t len = (n + r - 1) / r > STRESS_PROMPT ? (n + r - 1) / r : STRESS_PROMPT, n_seq = 0;
    for (int32_t i = 0; i < n; i++) {
        e->ids[i] = i % V;
        e->step_slots[i] = i;
        for (int k = 0; k < 3; k++)
            e->positions[k * n + i] = i % len;
    }
    for (int32_t at = 0; at < n; at += len, n_seq++) {
        int32_t q = n - at < len ? n - at : len;
        e->seqs[n_seq] = (vlmd_attn_seq){at, q, q, e->step_slots + at};
        e->seq_state[n_seq] = n_seq; /* (at most max_running sequences) */
        e->logit_rows[n_seq] = at + q - 1;
    }
    /* a model that takes images: the prefill starts with an image's rows (zeros, and
     * Qwen3-VL's DeepStack features), so the image path's copies and ops have run
     * before serving (on CUDA a kernel's first launch may take device memory) */
    int32_t image_rows = e->cfg.image_token_id >= 0 ? (n < STRESS_IMAGE ? n : STRESS_IMAGE) : 0;
    size_t H = lm_hidden_size(e->m);
    float *image = image_rows ? calloc((1 + (size_t)lm_deepstack_features(e->m)) *
                                           (size_t)image_rows * H, sizeof *image)
                              : NULL;
    if (image_rows && !image)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the stress's image rows");
    lm_embed_run run = {0, image_rows, image, (size_t)image_rows * H};
    const int32_t *states = e->hybrid ? e->seq_state : NULL;
    lm_batch prefill = {n, e->ids, e->positions, e->step_slots, e->seqs, n_seq, e->logit_rows,
                           n_seq, &run, image_rows ? 1 : 0, states};
    /* experts see the worst routing there is: every token on the same ones */
    lm_set_worst_case_routing(e->ws, true);
    vlmd_status s = lm_forward(e->m, e->kv, e->ws, &prefill, NULL, err);
    free(image);
    /* r sequences of one token each, every one attending to its own slot */
    for (int32_t i = 0; s == VLMD_OK && i < r; i++) {
        e->ids[i] = i % V;
        e->step_slots[i] = i;
        for (int k = 0; k < 3; k++)
            e->positions[k * r + i] = 0;
        e->seqs[i] = (vlmd_attn_seq){i, 1, 1, e->step_slots + i};
        e->seq_state[i] = i;
        e->logit_rows[i] = i;
    }
    lm_batch decode = {r, e->ids, e->positions, e->step_slots, e->seqs, r, e->logit_rows, r,
                          NULL, 0, states};
    if (s == VLMD_OK)
        s = lm_forward(e->m, e->kv, e->ws, &decode, NULL, err);
    lm_set_worst_case_routing(e->ws, false);
    /* and the sampler at its widest: every row with logprobs */
    for (int32_t i = 0; i < r; i++)
        e->sample_rows[i] = (vlmd_sample_row){.temperature = 1, .top_p = 0.9f, .top_k = 50,
                                              .min_p = 0.01f, .repetition_penalty = 1,
                                              .n_top = VLMD_MAX_TOP_LOGPROBS, .draw = (uint64_t)i};
    if (s == VLMD_OK)
        s = lm_sample(e->m, e->ws, 0, e->sample_rows, r, e->sample_out, err);
    return s;
}

/* ---- requests ----------------------------------------------------------------- */

static request *find(engine *e, uint64_t id, request **prev_out)
{
    request *prev = NULL;
    for (request *q = e->head; q; prev = q, q = q->next)
        if (q->id == id) {
            if (prev_out)
                *prev_out = prev;
            return q;
        }
    return NULL;
}

/* Checks a request's images against its prompt, the model and the arena,
 * and records them with the prompt's M-RoPE positions. */
static vlmd_status attach_images(engine *e, request *q, const vlmd_msg_request_submit *r,
                                 vlmd_error *err)
{
    unsigned long long id = (unsigned long long)r->req_id;
    if (e->cfg.image_token_id < 0 || !lm_uses_mrope(e->m))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu has images; this model "
                           "takes none", id);
    if (!e->cfg.arena || !e->cfg.arena->base)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "request %llu has images and the embedding "
                           "arena is not mapped", id);
    q->images = calloc(r->n_images, sizeof *q->images);
    q->mrope = malloc(3 * (size_t)r->n_tokens * sizeof *q->mrope);
    vlmd_image_grid *grids = malloc(r->n_images * sizeof *grids);
    vlmd_status st = q->images && q->mrope && grids
                         ? VLMD_OK
                         : vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for request %llu", id);
    uint64_t row_bytes = lm_image_token_bytes(e->m);
    int32_t merge = e->cfg.merge_size, end = 0;
    for (uint32_t i = 0; st == VLMD_OK && i < r->n_images; i++) {
        const vlmd_image_ref *im = &r->images[i];
        uint64_t grid = (uint64_t)im->grid_t * im->grid_h * im->grid_w;
        bool ok = merge > 0 && im->grid_h % (uint32_t)merge == 0 &&
                  im->grid_w % (uint32_t)merge == 0 &&
                  grid / ((uint64_t)merge * (uint64_t)merge) == im->token_count &&
                  im->token_count > 0 && (int64_t)im->token_offset >= end &&
                  (uint64_t)im->token_offset + im->token_count <= r->n_tokens;
        for (uint32_t k = 0; ok && k < im->token_count; k++)
            ok = r->tokens[im->token_offset + k] == (uint32_t)e->cfg.image_token_id;
        if (!ok) {
            st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: image %u (tokens %u + %u, "
                             "grid %ux%ux%u) does not match its pad tokens", id, i,
                             im->token_offset, im->token_count, im->grid_t, im->grid_h,
                             im->grid_w);
        } else if (im->arena_offset % sizeof(float) ||
                   !vlmd_shm_arena_holds(e->cfg.arena, im->arena_offset,
                                         im->token_count * row_bytes)) {
            st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: image %u's embeddings "
                             "(offset %llu, %llu bytes) are outside the arena", id, i,
                             (unsigned long long)im->arena_offset,
                             (unsigned long long)(im->token_count * row_bytes));
        }
        if (st != VLMD_OK)
            break;
        q->images[i] = (req_image){(int32_t)im->token_offset, (int32_t)im->token_count,
                                   (const float *)((const char *)e->cfg.arena->base +
                                                   im->arena_offset)};
        grids[i] = (vlmd_image_grid){im->grid_t, im->grid_h, im->grid_w};
        end = (int32_t)(im->token_offset + im->token_count);
    }
    int32_t next = 0;
    if (st == VLMD_OK)
        st = vlmd_mrope_positions(r->tokens, r->n_tokens, (uint32_t)e->cfg.image_token_id, grids,
                                  r->n_images, (uint32_t)merge, q->mrope, &next, err);
    free(grids);
    q->n_images = r->n_images;
    q->rope_delta = next - (int32_t)r->n_tokens;
    return st;
}

/* logit_bias: ids in the vocabulary, each once, biases in [-100, 100]. */
static vlmd_status check_logit_bias(engine *e, const vlmd_msg_request_submit *r, vlmd_error *err)
{
    uint32_t V = lm_vocab_size(e->m), i = 0;
    vlmd_status st = VLMD_OK;
    for (; i < r->n_logit_bias; i++) {
        const vlmd_logit_bias *lb = &r->logit_bias[i];
        if (lb->id >= V || !(fabs(lb->bias) <= 100)) {
            st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: logit_bias[%u] (token %u, "
                             "%g) is outside the vocabulary of %u or [-100, 100]",
                             (unsigned long long)r->req_id, i, lb->id, lb->bias, V);
            break;
        }
        if (e->seen_at[lb->id]) {
            st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: logit_bias names token %u "
                             "twice", (unsigned long long)r->req_id, lb->id);
            break;
        }
        e->seen_at[lb->id] = 1;
    }
    while (i--) /* seen_at is the sampler's scratch: zero between uses */
        e->seen_at[r->logit_bias[i].id] = 0;
    return st;
}

/* Room for the hashes of the event blocks a request's tokens can fill, and
 * its images' ids (the hex SHA-256 of their bytes). */
static vlmd_status track_blocks(engine *e, request *q, const vlmd_msg_request_submit *r,
                                int64_t total, vlmd_error *err)
{
    q->block_hash = malloc((size_t)(total / e->events.block_size + 1) * sizeof *q->block_hash);
    q->spans = r->n_images ? calloc(r->n_images, sizeof *q->spans) : NULL;
    if (!q->block_hash || (r->n_images && !q->spans))
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for request %llu",
                           (unsigned long long)r->req_id);
    for (uint32_t i = 0; i < r->n_images; i++) {
        q->spans[i].start = (int32_t)r->images[i].token_offset;
        q->spans[i].count = (int32_t)r->images[i].token_count;
        for (int k = 0; k < 32; k++)
            snprintf(q->spans[i].id + 2 * k, 3, "%02x", r->images[i].hash[k]);
    }
    return VLMD_OK;
}

/* A request's grammar: checked, taken from the cache (compiled on a miss),
 * its state at the start, its end tokens. */
static vlmd_status attach_grammar(engine *e, request *q, const vlmd_msg_request_submit *r,
                                  vlmd_error *err)
{
    const vlmd_request_grammar *gr = &r->grammar;
    unsigned long long id = (unsigned long long)r->req_id;
    int64_t V = lm_vocab_size(e->m);
    if (!e->grammars)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu has a grammar; this engine "
                           "has no vocabulary to match it against", id);
    if (r->ignore_eos)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: ignore_eos and a grammar "
                           "together (the grammar decides where the output ends)", id);
    if (gr->trigger < -1 || gr->trigger >= V || gr->trigger_after < -1 ||
        gr->trigger_after >= V || (gr->trigger_after >= 0 && gr->trigger < 0))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: grammar trigger %lld after "
                           "%lld: tokens of the vocabulary of %lld (a trigger_after needs a "
                           "trigger)", id, (long long)gr->trigger, (long long)gr->trigger_after,
                           (long long)V);
    /* the end tokens: eos_id and the stop tokens that are not text (a text one is held
     * to the grammar like any text: ending on it would append it to a complete value) */
    const uint8_t *bytes;
    size_t n;
    if (e->cfg.eos_id >= 0)
        q->end_ids[q->n_end++] = (uint32_t)e->cfg.eos_id;
    for (uint32_t i = 0; i < r->n_stop_tokens; i++)
        if (!vlmd_vocab_token(e->cfg.vocab, r->stop_tokens[i], &bytes, &n))
            q->end_ids[q->n_end++] = r->stop_tokens[i];
    if (!q->n_end)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: a grammar needs an end "
                           "token (the model's end-of-sequence or a special stop token)", id);
    q->gstate = malloc(sizeof *q->gstate);
    if (!q->gstate)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for request %llu", id);
    vlmd_status st = grammar_cache_acquire(e->grammars, gr->kind, gr->text, gr->n_text,
                                           &q->grammar, err);
    if (st != VLMD_OK) {
        if (err)
            vlmd_error_prefix(err, "request %llu: %s", id,
                              vlmd_grammar_kind_str((vlmd_grammar_kind)gr->kind));
        return st;
    }
    vlmd_grammar_state_init(grammar_entry_grammar(q->grammar), q->gstate);
    q->trigger = (int32_t)gr->trigger;
    q->trigger_after = (int32_t)gr->trigger_after;
    q->gphase = gr->trigger_after >= 0 ? GRAMMAR_ARMING
                : gr->trigger >= 0     ? GRAMMAR_WAITING
                                       : GRAMMAR_ACTIVE;
    return VLMD_OK;
}

static vlmd_status check_pooling(const engine *e, const vlmd_msg_request_submit *r,
                                 vlmd_error *err)
{
    unsigned long long id = (unsigned long long)r->req_id;
    if (r->pooling == VLMD_POOL_NONE)
        return VLMD_OK;
    if (r->pooling >= VLMD_POOL_COUNT || r->grammar.kind != VLMD_GRAMMAR_NONE)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: pooling %u%s", id,
                           r->pooling, r->grammar.kind ? " with a grammar" : " is unknown");
    bool logits = r->pooling == VLMD_POOL_LOGITS;
    if (logits != (r->n_pool_ids > 0) || r->n_pool_ids > VLMD_PROTO_MAX_POOL_IDS)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: %u pool ids for pooling %u",
                           id, r->n_pool_ids, r->pooling);
    for (uint32_t i = 0; i < r->n_pool_ids; i++)
        if (r->pool_ids[i] >= lm_vocab_size(e->m))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: pool id %u is outside "
                               "the vocabulary", id, r->pool_ids[i]);
    return VLMD_OK;
}

vlmd_status engine_submit(engine *e, const vlmd_msg_request_submit *r, vlmd_error *err)
{
    int64_t total = (int64_t)r->n_tokens + r->max_tokens;
    uint32_t V = lm_vocab_size(e->m);
    if (r->n_tokens == 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu has an empty prompt",
                           (unsigned long long)r->req_id);
    /* a prompt must fit the cache with room for a token; its output may not,
     * and then ends early with "length" */
    if ((int64_t)r->n_tokens >= e->cfg.kv_slots || total > e->cfg.max_model_len)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE,
                           "request %llu needs %lld tokens (prompt %u + max_tokens %u); the KV "
                           "cache holds %d, the model length is %d",
                           (unsigned long long)r->req_id, (long long)total, r->n_tokens,
                           r->max_tokens, e->cfg.kv_slots, e->cfg.max_model_len);
    for (uint32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] >= V)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: token %u at %u is outside "
                               "the vocabulary of %u", (unsigned long long)r->req_id,
                               r->tokens[i], i, V);
    for (uint32_t i = 0; i < r->n_stop_tokens; i++)
        if (r->stop_tokens[i] >= V)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu: stop token %u is outside "
                               "the vocabulary of %u", (unsigned long long)r->req_id,
                               r->stop_tokens[i], V);
    vlmd_status st = check_logit_bias(e, r, err);
    if (st != VLMD_OK)
        return st;
    if ((st = check_pooling(e, r, err)) != VLMD_OK)
        return st;
    if (find(e, r->req_id, NULL))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "request %llu is already running",
                           (unsigned long long)r->req_id);
    request *q = calloc(1, sizeof *q);
    if (q) {
        q->tokens = malloc((size_t)total * sizeof *q->tokens);
        q->slots = malloc((size_t)total * sizeof *q->slots);
        q->keys = malloc((size_t)total * sizeof *q->keys);
    }
    if (!q || !q->tokens || !q->slots || !q->keys) {
        if (q)
            request_free(e, q);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for request %llu",
                           (unsigned long long)r->req_id);
    }
    q->id = r->req_id;
    q->state = REQ_WAITING;
    q->state_slot = -1;
    q->restore_from = -1;
    if (r->n_logit_bias) {
        q->bias = malloc(r->n_logit_bias * sizeof *q->bias);
        if (!q->bias) {
            request_free(e, q);
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for request %llu",
                               (unsigned long long)r->req_id);
        }
        memcpy(q->bias, r->logit_bias, r->n_logit_bias * sizeof *q->bias);
        q->n_bias = r->n_logit_bias;
    }
    if (r->n_images) {
        st = attach_images(e, q, r, err);
        if (st != VLMD_OK) {
            request_free(e, q);
            return st;
        }
    }
    if (r->grammar.kind != VLMD_GRAMMAR_NONE) {
        st = attach_grammar(e, q, r, err);
        if (st != VLMD_OK) {
            request_free(e, q);
            return st;
        }
    }
    if (e->events_on && (st = track_blocks(e, q, r, total, err)) != VLMD_OK) {
        request_free(e, q);
        return st;
    }
    for (uint32_t i = 0; i < r->n_tokens; i++)
        q->keys[i] = q->tokens[i] = (int32_t)r->tokens[i];
    for (uint32_t i = 0; i < r->n_images; i++) {
        const uint8_t *h = r->images[i].hash;
        uint32_t base = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                        (uint32_t)h[3] << 24;
        for (int32_t k = 0; k < q->images[i].count; k++)
            q->keys[q->images[i].start + k] = IMAGE_KEY_BIT | ((base + (uint32_t)k) & ~IMAGE_KEY_BIT);
    }
    q->n_prompt = q->n_tokens = (int32_t)r->n_tokens;
    q->max_tokens = (int32_t)r->max_tokens;
    q->sampling = r->sampling;
    q->logprobs = r->logprobs;
    q->ignore_eos = r->ignore_eos;
    q->top_logprobs = r->top_logprobs > VLMD_MAX_TOP_LOGPROBS ? VLMD_MAX_TOP_LOGPROBS
                                                              : r->top_logprobs;
    q->min_tokens = (int32_t)(r->min_tokens < r->max_tokens ? r->min_tokens : r->max_tokens);
    q->n_stop = r->n_stop_tokens;
    if (r->n_stop_tokens)
        memcpy(q->stop, r->stop_tokens, r->n_stop_tokens * sizeof *q->stop);
    q->seed = r->sampling.has_seed ? r->sampling.seed : r->req_id;
    q->pooling = (vlmd_pooling)r->pooling;
    q->n_pool_ids = r->n_pool_ids;
    if (r->n_pool_ids)
        memcpy(q->pool_ids, r->pool_ids, r->n_pool_ids * sizeof *q->pool_ids);
    if (e->tail)
        e->tail->next = q;
    else
        e->head = q;
    e->tail = q;
    q->listed = true;
    e->n_active++;
    return VLMD_OK;
}

/* Hands q's computed tokens to the prefix cache (prefix_cache_insert's
 * ownership rules), logging the event blocks that this stores. */
static vlmd_status cache_insert(engine *e, request *q)
{
    if (!e->events_on)
        return prefix_cache_insert(e->cache, q->keys, q->slots, q->n_cached);
    int32_t B = e->events.block_size, end = q->n_cached / B, first;
    for (int32_t b = q->n_hashed; b < end; b++) /* each block once: its tokens never change */
        q->block_hash[b] = kv_events_block_hash(b ? q->block_hash[b - 1] : e->cfg.event_hash_root,
                                                q->tokens + (int64_t)b * B, B, b * B, q->spans,
                                                q->n_images);
    if (end > q->n_hashed)
        q->n_hashed = end;
    vlmd_status st = prefix_cache_insert_blocks(e->cache, q->keys, q->slots, q->n_cached,
                                                q->block_hash, &first);
    if (first < end)
        kv_event_stored(&e->events, q->block_hash + first, first, end - first,
                        first ? q->block_hash[first - 1] : 0, q->tokens, q->spans, q->n_images);
    return st;
}

/* A request's KV slots go back: into the prefix cache (which keeps them
 * until it needs room, and returns the duplicates), or to the free list. */
static void release_kv(engine *e, request *q)
{
    if (e->cache) {
        cache_insert(e, q); /* NOMEM: all freed */
        prefix_cache_unlock(e->cache, q->lock);
    } else {
        kv_slots_give(&e->slots, q->slots, q->n_cached);
    }
    q->n_cached = q->n_shared = 0;
    q->lock = NULL;
}

/* A request starts or stops running: the count, and a hybrid model's state
 * slot (taken from the pool, or given back: a paused request recomputes its
 * state from its tokens, as its KV). */
static void start_running(engine *e, request *q)
{
    q->state = REQ_RUNNING;
    e->n_running++;
    if (!e->hybrid)
        return;
    VLMD_ASSERT(e->n_state_free > 0); /* one slot per running request */
    q->state_slot = e->state_free[--e->n_state_free];
    if (q->restore_from >= 0) { /* (before the step that goes on from it) */
        VLMD_ASSERT(lm_state_copy(e->m, e->kv, q->restore_from, q->state_slot, NULL) == VLMD_OK);
        state_snapshots_touch(&e->snapshots, q->restore_from);
        q->restore_from = -1;
    }
    /* its prefill saves its state where a later request may resume, unless one is there */
    int32_t at = e->snapshots.n ? state_snapshot_point(q->n_prompt) : 0, slot;
    q->snapshot_at = at > q->n_cached &&
                             state_snapshots_find(&e->snapshots, q->keys, at, at + 1, &slot) != at
                         ? at
                         : 0;
}

static void stop_running(engine *e, request *q)
{
    q->state = REQ_WAITING;
    e->n_running--;
    if (q->state_slot >= 0)
        e->state_free[e->n_state_free++] = q->state_slot;
    q->state_slot = -1;
}

/* Ends a request on the list: its KV goes back (a running one's), it leaves
 * the list, and it is freed - the one way a listed request is freed. */
static void request_end(engine *e, request *q)
{
    request *prev = NULL;
    VLMD_ASSERT(q->listed && find(e, q->id, &prev) == q);
    if (q->state == REQ_RUNNING) {
        release_kv(e, q);
        stop_running(e, q);
    }
    if (prev)
        prev->next = q->next;
    else
        e->head = q->next;
    if (e->tail == q)
        e->tail = prev;
    q->listed = false;
    q->next = NULL;
    e->n_active--;
    request_free(e, q);
}

bool engine_cancel(engine *e, uint64_t req_id)
{
    request *q = find(e, req_id, NULL);
    if (!q)
        return false;
    request_end(e, q);
    return true;
}

int32_t engine_cancel_all(engine *e)
{
    int32_t n = 0;
    for (; e->head; n++)
        request_end(e, e->head);
    return n;
}

/* ---- one step ----------------------------------------------------------------- */

/* Pauses a running request: its KV slots go back and its tokens (prompt and
 * output so far) are recomputed when it is admitted again, which is before
 * anything that arrived after it. Its sampler state is kept, so it goes on
 * with the tokens it would have produced. */
static void preempt(engine *e, request *q)
{
    release_kv(e, q); /* the prefix cache keeps what it can: the recomputation may reuse it */
    stop_running(e, q);
    e->preemptions++;
    VLMD_REQ_DEBUG(q->id, "preempted at %d tokens (%d free slots)", q->n_tokens,
                   e->slots.n_free);
}

/* One step's batch, filled by schedule(). */
typedef struct step_plan {
    int32_t n_tok;      /* rows */
    int32_t n_seq;      /* attention sequences (one per request in the step) */
    int32_t n_logits;   /* requests that sample this step (their chunk ends their tokens) */
    int32_t budget;     /* tokens left in the step */
} step_plan;

/* Adds up to `count` of a request's uncached tokens (taking their slots) to
 * the batch; the request samples this step when they are its last ones. */
static void add_chunk(engine *e, request *q, int32_t count, step_plan *p)
{
    int32_t first = q->n_cached;
    VLMD_ASSERT(kv_slots_take(&e->slots, count, q->slots + first) == VLMD_OK);
    for (int32_t i = 0; i < count; i++) {
        e->ids[p->n_tok + i] = q->tokens[first + i];
        e->step_slots[p->n_tok + i] = q->slots[first + i];
    }
    e->seq_req[p->n_seq] = q;
    e->seq_state[p->n_seq] = q->state_slot;
    e->seqs[p->n_seq++] = (vlmd_attn_seq){p->n_tok, count, first + count, q->slots};
    /* the image tokens among these rows take their embeddings (and DeepStack
     * features) from the arena, whenever they are computed */
    size_t H = lm_hidden_size(e->m);
    for (uint32_t i = 0; i < q->n_images; i++) {
        const req_image *im = &q->images[i];
        int32_t lo = im->start > first ? im->start : first;
        int32_t hi = im->start + im->count < first + count ? im->start + im->count : first + count;
        if (lo < hi)
            e->embeds[e->n_embeds++] = (lm_embed_run){
                p->n_tok + lo - first, hi - lo, im->data + (size_t)(lo - im->start) * H,
                (size_t)im->count * H};
    }
    q->n_cached = first + count;
    if (q->n_cached == q->n_tokens) {
        e->logit_rows[p->n_logits] = p->n_tok + count - 1;
        e->in_step[p->n_logits++] = q;
    }
    p->n_tok += count;
    p->budget -= count;
}

static void emit_finish(engine *e, request *q, vlmd_finish_reason why);

/* True when n slots are free, taking unlocked cached prefixes back first. */
static bool make_room(engine *e, int32_t n)
{
    if (e->slots.n_free < n && e->cache)
        prefix_cache_evict(e->cache, n - e->slots.n_free);
    return e->slots.n_free >= n;
}

/* The tokens of q this step takes: all it has uncached (a decode: one),
 * within the step's budget and --chunked-prefill-size. */
static int32_t chunk_of(const engine *e, const request *q, const step_plan *p)
{
    int32_t want = q->n_tokens - q->n_cached, limit = p->budget;
    if (e->cfg.chunk_tokens > 0 && e->cfg.chunk_tokens < limit)
        limit = e->cfg.chunk_tokens;
    if (q->snapshot_at > q->n_cached && q->snapshot_at - q->n_cached < limit)
        limit = q->snapshot_at - q->n_cached; /* the chunk ends where its state is saved */
    return want < limit ? want : limit;
}

/* True when a running request is still computing a prompt that shares at
 * least SHARE_MIN_TOKENS more tokens with q's than the cache gave q, or all
 * of q's but its last: q waits for them to enter the cache (share_prompt,
 * after each step) rather than compute them again (the other choices of an
 * n > 1 request, a system prompt many send at once). */
#define SHARE_MIN_TOKENS 16
static bool prompt_in_flight(const engine *e, const request *q)
{
    if (!e->cache)
        return false;
    for (const request *r = e->head; r; r = r->next) {
        if (r == q || r->state != REQ_RUNNING || r->n_tokens != r->n_prompt)
            continue; /* (a request with output has its prompt in the cache or its own) */
        int32_t n = r->n_prompt < q->n_tokens - 1 ? r->n_prompt : q->n_tokens - 1, same = 0;
        while (same < n && r->keys[same] == q->keys[same])
            same++;
        bool whole = same == q->n_tokens - 1 && same > q->n_cached; /* all q would compute */
        if (same >= q->n_cached + SHARE_MIN_TOKENS || whole)
            return true;
    }
    return false;
}

/* Hands the prompt tokens q has computed so far (all, or the chunks of a long
 * prompt) to the prefix cache while q goes on from them (their slots now the
 * cache's, locked), so that the requests that wait for them
 * (prompt_in_flight) start from there. */
static void share_prompt(engine *e, request *q)
{
    prefix_cache_unlock(e->cache, q->lock);
    q->lock = NULL;
    if (cache_insert(e, q) != VLMD_OK) {
        q->n_cached = q->n_shared = 0; /* its slots went back: recomputed, as if preempted */
        stop_running(e, q);
        return;
    }
    /* the same tokens: their slots are the cache's now (a duplicate may have moved) */
    q->n_cached = q->n_shared = prefix_cache_match(e->cache, q->keys, q->n_cached, q->slots,
                                                   &q->lock);
}

/* Takes the longest cached prefix of a waiting request (all but its last
 * token: that one must be computed for its logits). */
static void reuse_prefix(engine *e, request *q)
{
    if (e->cache && !e->hybrid)
        q->n_cached = q->n_shared =
            prefix_cache_match(e->cache, q->keys, q->n_tokens - 1, q->slots, &q->lock);
    if (!e->cache || !e->hybrid)
        return;
    /* a hybrid model resumes only where a state was saved, and its KV is still cached */
    for (int32_t below = INT32_MAX, slot = -1;;) {
        int32_t len = state_snapshots_find(&e->snapshots, q->keys, q->n_tokens - 1, below, &slot);
        if (!len)
            return;
        if (prefix_cache_match(e->cache, q->keys, len, q->slots, &q->lock) == len) {
            q->n_cached = q->n_shared = len;
            q->restore_from = slot;
            return;
        }
        prefix_cache_unlock(e->cache, q->lock);
        q->lock = NULL;
        below = len;
    }
}

static void forget_prefix(engine *e, request *q)
{
    if (e->cache)
        prefix_cache_unlock(e->cache, q->lock);
    q->n_cached = q->n_shared = 0;
    q->lock = NULL;
    q->restore_from = -1;
}

/* The step's batch: the running requests first, oldest first (a decode token
 * each, or the next chunk of a prompt being prefilled), taking unused cached
 * prefixes, then the slots of the newest running requests, when the cache is
 * short; then waiting requests (paused ones first: they are older), each from
 * its longest cached prefix, while the budget, the sequence limit and the
 * slots allow, first come first served.
 *
 * The invariant, which holds between steps (engine_check_invariants checks
 * it; within a step add_chunk makes n_cached run ahead until sampling):
 *
 *   WAITING (new, or preempted, or its shared prompt could not be cached):
 *     it holds no KV: n_cached = n_shared = 0, lock NULL. Its tokens, output
 *     so far and sampler state survive; its KV is recomputed on admission.
 *   RUNNING: tokens[0..n_cached) have KV in slots[0..n_cached), and
 *       0 <= n_shared <= n_cached < n_tokens
 *     (at least its next token is still to compute). slots[0..n_shared) are
 *     the prefix cache's, along the path `lock` locks, which is exactly
 *     n_shared keys long (lock != NULL iff n_shared > 0; never without the
 *     cache); slots[n_shared..n_cached) are its own.
 *   Every KV slot is held by exactly one of: the free list, the prefix cache
 *     (a node's; locked or evictable), one running request's own range. So
 *       free + cache tokens + sum over running of (n_cached - n_shared)
 *         = capacity,
 *     and the cache's locked paths are the running requests' locks.
 *   n_running counts the RUNNING requests (at most max_running), n_active
 *     the list; the list (head..tail, arrival order) owns every request, and
 *     a request leaves it only through request_end, which frees it.
 *
 * What keeps it: preempt() and request_end() give all of a running request's
 * KV back (release_kv: into the cache, or the free list) before it stops
 * running; share_prompt() moves its own range into the cache and re-locks it
 * (n_shared = n_cached), or on failure makes it WAITING with nothing; admission
 * takes a lock (reuse_prefix) and drops it again (forget_prefix) when the
 * request does not go in. */
static void schedule(engine *e, step_plan *p)
{
    int32_t nr = 0;
    for (request *q = e->head; q; q = q->next)
        if (q->state == REQ_RUNNING)
            e->running[nr++] = q;
    for (int32_t i = 0; i < nr && p->budget > 0; i++) {
        request *q = e->running[i];
        if (q->state != REQ_RUNNING)
            continue; /* paused for an older one in this loop */
        int32_t want = chunk_of(e, q, p);
        /* cached prefixes no one uses go first, then the newest running requests */
        for (int32_t j = nr - 1; j > i && !make_room(e, want); j--)
            if (e->running[j]->state == REQ_RUNNING)
                preempt(e, e->running[j]);
        bool room = make_room(e, want);
        if (!room && e->slots.n_free > 0 && want > 1) {
            want = e->slots.n_free; /* a shorter chunk of its prompt */
        } else if (!room) {
            if (e->n_running == 1) { /* alone and still no room: never preempted for itself */
                emit_finish(e, q, VLMD_FINISH_LENGTH);
                e->running[i] = NULL;
                continue;
            }
            preempt(e, q); /* the older ones hold the cache: this one waits */
            continue;
        }
        add_chunk(e, q, want, p);
    }
    int32_t decoding = e->n_running;
    for (request *q = e->head; q && p->budget > 0; q = q->next) {
        if (q->state != REQ_WAITING)
            continue;
        if (e->n_running == e->cfg.max_running)
            break;
        reuse_prefix(e, q);
        int32_t need = q->n_tokens - q->n_cached;
        int32_t room = e->slots.n_free + (e->cache ? prefix_cache_evictable(e->cache) : 0);
        if (room < need + decoding || prompt_in_flight(e, q)) {
            forget_prefix(e, q);
            break; /* no overtaking: what does not fit now waits, and so does what came after */
        }
        if (!q->admitted) { /* (a recomputation after preemption is not a cache hit) */
            q->admitted = true;
            q->cached_tokens = (uint32_t)q->n_cached;
            e->prompt_tokens += (uint64_t)q->n_prompt;
            e->cached_tokens += (uint64_t)q->n_cached;
        }
        start_running(e, q);
        int32_t chunk = chunk_of(e, q, p);
        VLMD_ASSERT(make_room(e, chunk)); /* room >= need >= chunk */
        add_chunk(e, q, chunk, p);
    }
}

static vlmd_finish_reason finished(const engine *e, const request *q, int32_t tok)
{
    if (tok == e->cfg.eos_id && !q->ignore_eos)
        return VLMD_FINISH_STOP;
    for (uint32_t i = 0; i < q->n_stop; i++)
        if ((uint32_t)tok == q->stop[i])
            return VLMD_FINISH_STOP;
    if (q->n_tokens - q->n_prompt >= q->max_tokens)
        return VLMD_FINISH_LENGTH;
    return VLMD_FINISH_NONE;
}

/* The tokens [*from, *to) of q its penalties look at: repetition counts the
 * prompt and the output, presence and frequency the output; none: empty. */
static void penalized_tokens(const request *q, int32_t *from, int32_t *to)
{
    const vlmd_sampling *sp = &q->sampling;
    bool rep = sp->repetition_penalty != 1.0;
    bool out = rep || sp->presence_penalty != 0.0 || sp->frequency_penalty != 0.0;
    *from = rep ? 0 : q->n_prompt;
    *to = out ? q->n_tokens : *from;
}

/* Sets id's bias in row's seen list (adding it as an unpenalized entry). */
static void bias_token(engine *e, vlmd_sample_row *row, int32_t id, float bias)
{
    if (!e->seen_at[id]) {
        row->seen[row->n_seen] = (vlmd_seen_token){.id = id};
        e->seen_at[id] = ++row->n_seen;
    }
    row->seen[e->seen_at[id] - 1].bias = bias;
}

/* Row i's sampling parameters, its seen tokens appended at e->seen + *n_seen. */
static void sample_row(engine *e, const request *q, vlmd_sample_row *row, int32_t *n_seen)
{
    const vlmd_sampling *sp = &q->sampling;
    int32_t n_out = q->n_tokens - q->n_prompt;
    *row = (vlmd_sample_row){
        .temperature = (float)sp->temperature, .top_p = (float)sp->top_p,
        .min_p = (float)sp->min_p, .top_k = sp->top_k,
        .repetition_penalty = (float)sp->repetition_penalty,
        .presence_penalty = (float)sp->presence_penalty,
        .frequency_penalty = (float)sp->frequency_penalty,
        .n_top = q->logprobs ? (int32_t)q->top_logprobs : -1,
        .seed = q->seed, .draw = (uint64_t)n_out, .seen = e->seen + *n_seen,
    };
    int32_t from, to;
    penalized_tokens(q, &from, &to);
    for (int32_t i = from; i < to; i++) {
        int32_t id = q->tokens[i];
        if (!e->seen_at[id]) {
            row->seen[row->n_seen] = (vlmd_seen_token){.id = id, .penalize = 1};
            e->seen_at[id] = ++row->n_seen;
        }
        row->seen[e->seen_at[id] - 1].output_count += i >= q->n_prompt;
    }
    for (uint32_t i = 0; i < q->n_bias; i++)
        bias_token(e, row, (int32_t)q->bias[i].id, (float)q->bias[i].bias);
    if (n_out < q->min_tokens && q->gphase != GRAMMAR_ACTIVE) { /* nothing may end it yet */
        if (e->cfg.eos_id >= 0 && !q->ignore_eos)
            bias_token(e, row, e->cfg.eos_id, -INFINITY);
        for (uint32_t i = 0; i < q->n_stop; i++)
            bias_token(e, row, (int32_t)q->stop[i], -INFINITY);
    }
    for (int32_t i = 0; i < row->n_seen; i++)
        e->seen_at[row->seen[i].id] = 0;
    *n_seen += row->n_seen;
}

/* ---- constrained decoding ------------------------------------------------------ */

/* The shortest way from st on to a complete output: its first byte (*byte; -1
 * when no byte may follow) and its length in bytes, that byte included
 * (SIZE_MAX when none). Where st is not complete that is its shortest
 * completion; where it is, the shortest continuation that completes again
 * (another call after a whole one). */
static size_t shortest_step(const vlmd_grammar *g, const vlmd_grammar_state *st, int *byte)
{
    size_t best = SIZE_MAX;
    vlmd_grammar_state c;
    *byte = -1;
    for (int b = 0; b < 256; b++) {
        uint8_t u = (uint8_t)b;
        memcpy(c.w, st->w, st->w[0] * sizeof st->w[0]);
        if (!vlmd_grammar_accept_bytes(g, &c, &u, 1))
            continue;
        size_t m = 1 + vlmd_grammar_min_completion(g, &c);
        if (m < best)
            best = m, *byte = b;
    }
    return best;
}

/* Row i's mask for request q, whose grammar holds: the grammar's, or near
 * max_tokens only the way to the end (the end tokens once complete, else
 * the single-byte token of the shortest completion's next byte). A complete
 * output ends once the tokens left could not complete anything more: more
 * begun would be cut. */
/* The token that writes the most of the shortest completion from st: the
 * completion's bytes (at most CLOSE_BYTES of them, a byte at a time by
 * shortest_step), then the vocabulary's longest token that starts them (a
 * prefix of a valid completion, so the grammar takes it). -1: none. */
#define CLOSE_BYTES 256
static int32_t closing_token(const engine *e, const vlmd_grammar *g,
                             const vlmd_grammar_state *st)
{
    uint8_t text[CLOSE_BYTES];
    size_t n = 0;
    vlmd_grammar_state c;
    memcpy(c.w, st->w, st->w[0] * sizeof st->w[0]);
    while (n < CLOSE_BYTES && vlmd_grammar_min_completion(g, &c) > 0) {
        int b;
        if (shortest_step(g, &c, &b) == SIZE_MAX || b < 0)
            break;
        text[n++] = (uint8_t)b;
        uint8_t u = (uint8_t)b;
        vlmd_grammar_accept_bytes(g, &c, &u, 1);
    }
    int32_t best = n ? e->byte_token[text[0]] : -1;
    size_t best_len = best >= 0 ? 1 : 0;
    uint32_t V = vlmd_vocab_size(e->cfg.vocab);
    for (uint32_t id = 0; id < V; id++) {
        const uint8_t *bytes;
        size_t len;
        if (vlmd_vocab_token(e->cfg.vocab, id, &bytes, &len) && len > best_len && len <= n &&
            memcmp(bytes, text, len) == 0)
            best = (int32_t)id, best_len = len;
    }
    return best;
}

static vlmd_status fill_mask(engine *e, request *q, uint32_t *mask, vlmd_error *err)
{
    const vlmd_grammar *g = grammar_entry_grammar(q->grammar);
    int32_t left = q->max_tokens - (q->n_tokens - q->n_prompt); /* this one included */
    size_t need = vlmd_grammar_min_completion(g, q->gstate);
    int b = -1;
    size_t room = need ? need : shortest_step(g, q->gstate, &b); /* what the bytes after need */
    if (room == SIZE_MAX || (size_t)left <= room + ENGINE_GRAMMAR_CLOSE_MARGIN) {
        /* the shortest completion, as few tokens as the vocabulary writes it in */
        int32_t tok = need ? closing_token(e, g, q->gstate) : -1;
        q->closing = q->closing || tok >= 0;
        if (!need || tok >= 0) {
            memset(mask, 0, e->mask_words * sizeof *mask);
            if (need)
                mask[tok / 32] |= 1u << (tok % 32);
            for (uint32_t k = 0; !need && k < q->n_end; k++)
                mask[q->end_ids[k] / 32] |= 1u << (q->end_ids[k] % 32);
            return VLMD_OK;
        }
    }
    return vlmd_masker_fill(grammar_entry_masker(q->grammar), q->gstate, q->end_ids, q->n_end,
                            mask, e->mask_words, e->scratch, err);
}

/* Every sampling row's mask (NULL when its request's output is free), once
 * a step, while the device runs the forward pass. A mask that cannot be
 * made (out of memory) ends its request with an error after sampling, not
 * the step. */
static void fill_masks(engine *e, int32_t n_logits)
{
    for (int32_t i = 0; i < n_logits; i++) {
        request *q = e->in_step[i];
        e->row_masks[i] = NULL;
        if (q->gphase != GRAMMAR_ACTIVE)
            continue;
        uint32_t *mask = e->masks + (size_t)i * e->mask_words;
        vlmd_error err = {0};
        if (fill_mask(e, q, mask, &err) != VLMD_OK) {
            VLMD_REQ_WARN(q->id, "no token mask: %s", err.msg);
            q->mask_failed = true;
            continue;
        }
        e->row_masks[i] = mask;
    }
}

static bool is_end(const request *q, int32_t tok)
{
    for (uint32_t k = 0; k < q->n_end; k++)
        if ((uint32_t)tok == q->end_ids[k])
            return true;
    return false;
}

/* How q's output goes on after token tok under its grammar: a trigger moves
 * the phase; under an active grammar an end token where the value is
 * complete ends it (STOP), any other token advances the state, and a token
 * the automaton refuses ends it with an error (*why). NONE: go on (free
 * text: the usual ends are checked by the caller). */
static vlmd_finish_reason grammar_token(engine *e, request *q, int32_t tok, char *why,
                                        size_t why_size)
{
    (void)e;
    switch (q->gphase) {
    case GRAMMAR_OFF:
        return VLMD_FINISH_NONE;
    case GRAMMAR_ARMING:
        if (tok == q->trigger_after)
            q->gphase = GRAMMAR_WAITING;
        return VLMD_FINISH_NONE;
    case GRAMMAR_WAITING:
        if (tok == q->trigger)
            q->gphase = GRAMMAR_ACTIVE; /* the trigger is free text; the grammar follows it */
        return VLMD_FINISH_NONE;
    case GRAMMAR_ACTIVE:
        break;
    }
    const vlmd_grammar *g = grammar_entry_grammar(q->grammar);
    if (vlmd_grammar_is_complete(g, q->gstate) && is_end(q, tok))
        return VLMD_FINISH_STOP;
    if (vlmd_masker_accept(grammar_entry_masker(q->grammar), q->gstate, (uint32_t)tok))
        return VLMD_FINISH_NONE;
    snprintf(why, why_size, "the grammar's mask allowed token %d but its automaton refused it "
             "(an ambiguous grammar whose state outgrew %d words); the output ends here",
             tok, VLMD_GRAMMAR_STATE_WORDS);
    VLMD_REQ_WARN(q->id, "%s", why);
    return VLMD_FINISH_ERROR;
}

/* Samples the step's logit rows, as many at once as the seen tokens allow. */
static vlmd_status sample_step(engine *e, int32_t n_logits, vlmd_error *err)
{
    int32_t cap = lm_seen_capacity(e->ws);
    for (int32_t first = 0; first < n_logits;) {
        int32_t n = 0, n_seen = 0;
        while (first + n < n_logits) {
            const request *q = e->in_step[first + n];
            /* a row adds at most its penalized, biased and banned tokens, and at most
             * the vocabulary (distinct ids), which fits alone */
            int32_t from, to;
            penalized_tokens(q, &from, &to);
            int32_t extra = (int32_t)(q->n_bias + 1 + q->n_stop); /* biases and bans */
            if (n && n_seen + (to - from) + extra > cap)
                break;
            sample_row(e, q, &e->sample_rows[first + n], &n_seen);
            e->sample_rows[first + n].mask = e->row_masks[first + n];
            n++;
        }
        vlmd_status s = lm_sample(e->m, e->ws, first, e->sample_rows + first, n,
                                     e->sample_out + first, err);
        if (s != VLMD_OK)
            return s;
        first += n;
    }
    return VLMD_OK;
}

/* Ends a request now with no more tokens (its KV could not grow). */
static void emit_finish(engine *e, request *q, vlmd_finish_reason why)
{
    engine_output o = {q->id, NULL, 0, why, (uint32_t)q->n_prompt,
                       (uint32_t)(q->n_tokens - q->n_prompt), q->cached_tokens, NULL, NULL,
                       VLMD_OK};
    e->emit(&o, e->ud);
    request_end(e, q);
}

/* The books broke (engine_check_invariants said how): nothing they say can be
 * trusted, so none of it is given back. Every request holds nothing now and
 * ends with an error; the prefix cache is forgotten (AllBlocksCleared when
 * events are on) and every slot is free again. The process goes on serving
 * from a state that holds the invariant. */
static void reset_books(engine *e, const char *why)
{
    char msg[sizeof(vlmd_error) + 64];
    snprintf(msg, sizeof msg, "the engine's books broke (%s); its requests ended", why);
    for (request *q = e->head; q; q = q->next) {
        q->lock = NULL; /* void once the cache is forgotten */
        q->n_cached = q->n_shared = 0;
        if (q->state == REQ_RUNNING)
            stop_running(e, q);
    }
    if (e->cache) {
        prefix_cache_forget(e->cache);
        state_snapshots_clear(&e->snapshots); /* (the KV they go with is gone) */
        if (e->events_on)
            kv_event_all_cleared(&e->events);
    }
    kv_slots_reset(&e->slots);
    while (e->head) {
        request *q = e->head;
        engine_output o = {q->id, NULL, 0, VLMD_FINISH_ERROR, (uint32_t)q->n_prompt,
                           (uint32_t)(q->n_tokens - q->n_prompt), q->cached_tokens, NULL, msg,
                           VLMD_ERR_INTERNAL};
        e->emit(&o, e->ud);
        request_end(e, q);
    }
    e->resets++;
}

/* After every step: with cfg.check_invariants (any build) the whole
 * invariant is checked, and a broken one is logged and the engine resets
 * (reset_books): the requests fail, the process does not. Without it, debug
 * builds check the books (O(requests): who holds each of a large cache's
 * slots would cost every step a pass over all of them) and stop the process
 * at once (the supervisor restarts it); release builds do not look. */
static void check_step(engine *e)
{
    vlmd_error err = {0};
#ifdef NDEBUG
    if (!e->cfg.check_invariants)
        return;
#endif
    vlmd_status st = e->cfg.check_invariants ? engine_check_invariants(e, &err)
                                             : check_books(e, &err);
    if (st == VLMD_OK)
        return;
    if (!e->cfg.check_invariants)
        VLMD_FATAL("the engine's invariant broke: %s", err.msg);
    VLMD_ERROR("the engine's invariant broke: %s; %d request(s) end with an error and the KV "
               "cache is emptied", err.msg, e->n_active);
    reset_books(e, err.msg);
}

/* The pooling requests' answers from the step's logit rows (q->answer; NULL:
 * no memory for it), before sampling changes the logits. */
static void take_pooled(engine *e, int32_t n_logits)
{
    for (int32_t i = 0; i < n_logits; i++) {
        request *q = e->in_step[i];
        if (!q->pooling)
            continue;
        q->n_answer = q->pooling == VLMD_POOL_LOGITS ? (int32_t)q->n_pool_ids
                                                     : (int32_t)lm_hidden_size(e->m);
        free(q->answer);
        q->answer = malloc((size_t)q->n_answer * sizeof *q->answer);
        if (q->answer && lm_pooled(e->m, e->ws, i,
                                   q->pooling == VLMD_POOL_LOGITS ? q->pool_ids : NULL,
                                   (int)q->n_pool_ids, q->answer, NULL) != VLMD_OK) {
            free(q->answer);
            q->answer = NULL;
        }
    }
}

/* A pooling request's answer, and its end. */
static void emit_pooled(engine *e, request *q)
{
    engine_output o = {.req_id = q->id, .finish = q->answer ? VLMD_FINISH_STOP
                                                            : VLMD_FINISH_ERROR,
                       .prompt_tokens = (uint32_t)q->n_prompt,
                       .cached_tokens = q->cached_tokens,
                       .error = q->answer ? NULL : "out of memory for the answer",
                       .status = q->answer ? VLMD_OK : VLMD_ERR_NOMEM, .pooled = q->answer,
                       .n_pooled = q->answer ? q->n_answer : 0};
    e->emit(&o, e->ud);
}

vlmd_status engine_step(engine *e, bool *did_work, vlmd_error *err)
{
    *did_work = false;
    e->n_embeds = 0;
    step_plan plan = {.budget = e->cfg.max_batch_tokens};
    schedule(e, &plan);
    int32_t n_tok = plan.n_tok, n_seq = plan.n_seq;
    if (n_seq == 0) { /* (schedule may still have ended or paused requests) */
        check_step(e);
        return VLMD_OK;
    }
    /* Text positions are the token indices, the same in all three M-RoPE rows;
     * an image prompt has its own, and its output continues from them. */
    for (int32_t s = 0; s < n_seq; s++) {
        const vlmd_attn_seq *sq = &e->seqs[s];
        const request *q = e->seq_req[s];
        for (int32_t i = 0; i < sq->q_len; i++) {
            int32_t t = sq->kv_len - sq->q_len + i;
            for (int r = 0; r < 3; r++)
                e->positions[r * n_tok + sq->q_start + i] =
                    q->mrope && t < q->n_prompt ? q->mrope[r * q->n_prompt + t]
                                                : t + q->rope_delta;
        }
    }
    lm_batch bt = {n_tok, e->ids, e->positions, e->step_slots, e->seqs, n_seq, e->logit_rows,
                      plan.n_logits, e->embeds, e->n_embeds, e->hybrid ? e->seq_state : NULL};
    vlmd_status s = lm_forward(e->m, e->kv, e->ws, &bt, NULL, err);
    if (s == VLMD_OK)
        take_pooled(e, plan.n_logits);
    if (s == VLMD_OK)
        fill_masks(e, plan.n_logits);
    if (s == VLMD_OK)
        s = sample_step(e, plan.n_logits, err);
    if (s != VLMD_OK)
        return s;
    *did_work = true;
    for (int32_t i = 0; i < n_seq; i++) { /* a hybrid model's states where they are saved */
        request *q = e->seq_req[i];
        if (q->snapshot_at && q->n_cached == q->snapshot_at) {
            int32_t slot = state_snapshots_take(&e->snapshots, q->keys, q->snapshot_at);
            VLMD_ASSERT(lm_state_copy(e->m, e->kv, q->state_slot, slot, NULL) == VLMD_OK);
            q->snapshot_at = 0;
        }
    }
    for (int32_t i = 0; i < n_seq && e->cache; i++) { /* prompts computed: others may use them */
        request *q = e->seq_req[i];
        bool prompt_done = q->n_cached == q->n_prompt && q->n_cached > q->n_shared;
        if (q->state == REQ_RUNNING && q->n_tokens == q->n_prompt &&
            (q->n_cached - q->n_shared >= SHARE_MIN_TOKENS || prompt_done))
            share_prompt(e, q);
    }
    for (int32_t i = 0; i < plan.n_logits; i++) {
        request *q = e->in_step[i];
        if (q->pooling) { /* one pass over its prompt: its answer, no token */
            emit_pooled(e, q);
            request_end(e, q);
            e->in_step[i] = NULL;
            continue;
        }
        const vlmd_sample_out *so = &e->sample_out[i];
        int32_t tok = so->token;
        engine_logprobs lp = {so->logprob, (uint32_t)so->n_top, {0}, {0}};
        for (int32_t k = 0; k < so->n_top; k++) {
            lp.top_ids[k] = (uint32_t)so->top_ids[k];
            lp.top_logprobs[k] = so->top_logprobs[k];
        }
        q->keys[q->n_tokens] = (uint32_t)tok;
        q->tokens[q->n_tokens++] = tok;
        e->generated_tokens++;
        char why[256] = "";
        bool held = q->gphase == GRAMMAR_ACTIVE; /* only the grammar says where it ends */
        vlmd_finish_reason fin = VLMD_FINISH_ERROR;
        if (q->mask_failed)
            snprintf(why, sizeof why, "out of memory for the grammar's token mask");
        else
            fin = grammar_token(e, q, tok, why, sizeof why);
        if (fin == VLMD_FINISH_NONE)
            fin = held ? (q->n_tokens - q->n_prompt >= q->max_tokens ? VLMD_FINISH_LENGTH
                                                                     : VLMD_FINISH_NONE)
                       : finished(e, q, tok);
        engine_output o = {q->id, &tok, 1, fin, (uint32_t)q->n_prompt,
                           (uint32_t)(q->n_tokens - q->n_prompt), q->cached_tokens,
                           q->logprobs ? &lp : NULL, why[0] ? why : NULL,
                           fin == VLMD_FINISH_ERROR ? VLMD_ERR_INVALID_ARG : VLMD_OK,
                           q->closing && fin == VLMD_FINISH_STOP};
        e->emit(&o, e->ud);
        if (fin != VLMD_FINISH_NONE) {
            request_end(e, q);
            e->in_step[i] = NULL;
        }
    }
    check_step(e);
    return VLMD_OK;
}
