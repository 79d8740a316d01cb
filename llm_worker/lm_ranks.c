/* lm_ranks.c - the rank processes of a tensor-parallel group (issue 22):
 * what rank 0 tells the other ranks, and what they do with it.
 *
 * Rank 0 runs the engine; the engine calls the model as it does alone. Every
 * call that touches the group's memory or its collectives is a command,
 * broadcast by rank 0 before it runs the call itself: a fixed header, then,
 * for a step, the batch as one block of bytes (its ids, positions, slots,
 * logit rows, attention sequences with their slot lists, and the image rows'
 * embeddings copied out of the arena, so no other rank maps it). The other
 * ranks wait for the next header in lm_follow and run the same call on
 * their shard, with their own KV caches and workspaces named by the ids rank
 * 0 gave them. A create is agreed: every rank's status all-gathered, and
 * where one failed, those that succeeded free theirs, so the group holds the
 * same things on every rank. An idle rank 0 pings within the communicator's
 * timeout, so a follower's wait fails only when rank 0 is gone or hung.
 * The messages are host memory; on CUDA they travel through a device buffer. */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"
#include "lm_impl.h"

typedef enum ranks_op {
    OP_PING = 1,
    OP_STOP,
    OP_KV_CREATE,       /* a: slots, b: state slots */
    OP_KV_FREE,
    OP_WS_CREATE,       /* a: max tokens, b: max logits, c: max KV length */
    OP_WS_FREE,
    OP_FORWARD,         /* a: tokens, b: sequences, c: logit rows, d: embedding runs */
    OP_CAPTURE,
    OP_STATE_COPY,      /* a: from, b: to (state slots) */
} ranks_op;

#define RANKS_MAGIC 0x564c4d52u /* "VLMR" */
#define RANKS_MAX_HANDLES 8     /* KV caches or workspaces held at once (the profile's two) */

/* What rank 0 broadcasts first, the same size on every rank. */
typedef struct ranks_cmd {
    uint32_t magic, op;
    uint32_t kv, ws;            /* the handles it names */
    int32_t a, b, c, d;
    uint64_t payload;           /* bytes of the second broadcast (a step's batch) */
} ranks_cmd;

typedef struct handle {
    uint32_t id;
    void *p;                    /* lm_kv or lm_workspace; NULL: free entry */
} handle;

/* The CUDA communicator moves device memory: there the group's messages, which
 * are host memory, go through a device buffer in pieces of this size (on the
 * CPU, backend memory is host memory and nothing is copied). */
#define RANKS_STAGE_BYTES ((size_t)4 << 20)

struct lm_ranks {
    bool leads;                 /* rank 0 */
    void *stage;                /* RANKS_STAGE_BYTES of backend memory; NULL on the CPU */
    uint32_t next_id;           /* rank 0: the last id given */
    unsigned char *buf;         /* a step's batch, sent or received */
    size_t cap;
    int32_t *statuses;          /* [world]: an agreement's */
    handle kvs[RANKS_MAX_HANDLES], wss[RANKS_MAX_HANDLES]; /* the others: rank 0's ids */
};

/* ---- both sides ------------------------------------------------------------- */

/* Rank 0's bytes at buf (host memory) into every rank's buf. */
static vlmd_status broadcast(lm_model *m, void *buf, size_t bytes, vlmd_error *err)
{
    lm_ranks *g = m->ranks;
    if (!g->stage)
        return vlmd_comm_broadcast(m->comm, buf, bytes, 0, err);
    vlmd_status s = VLMD_OK;
    for (size_t at = 0; s == VLMD_OK && at < bytes; at += RANKS_STAGE_BYTES) {
        size_t n = bytes - at < RANKS_STAGE_BYTES ? bytes - at : RANKS_STAGE_BYTES;
        if (g->leads)
            s = vlmd_backend_copy_to_device(m->b, g->stage, (char *)buf + at, n, err);
        if (s == VLMD_OK)
            s = vlmd_comm_broadcast(m->comm, g->stage, n, 0, err);
        if (s == VLMD_OK && !g->leads) /* (waits for the stream) */
            s = vlmd_backend_copy_to_host(m->b, (char *)buf + at, g->stage, n, err);
    }
    return s;
}

/* Each rank's `bytes` at its slot of buf (host memory, [world][bytes]) into
 * every rank's buf. */
static vlmd_status gather(lm_model *m, void *buf, size_t bytes, vlmd_error *err)
{
    lm_ranks *g = m->ranks;
    size_t count = bytes / sizeof(float), all = bytes * (size_t)m->world;
    if (!g->stage)
        return vlmd_comm_all_gather(m->comm, buf, count, VLMD_DTYPE_F32, err);
    char *mine = (char *)buf + (size_t)m->rank * bytes;
    vlmd_status s = vlmd_backend_copy_to_device(m->b, (char *)g->stage + (size_t)m->rank * bytes,
                                                mine, bytes, err);
    if (s == VLMD_OK)
        s = vlmd_comm_all_gather(m->comm, g->stage, count, VLMD_DTYPE_F32, err);
    return s == VLMD_OK ? vlmd_backend_copy_to_host(m->b, buf, g->stage, all, err) : s;
}

/* The batch bytes a workspace's largest step takes: its ints, then the
 * embeddings of every row (each DeepStack feature's too). */
static size_t batch_capacity(const lm_model *m, const lm_workspace *ws)
{
    size_t n = (size_t)ws->max_tokens, r = (size_t)ws->max_logits;
    size_t ints = 5 * n + r + 3 * r + r + ws->table_len + 2 * n; /* (+ r: state slots) */
    return ints * sizeof(int32_t) + n * (size_t)m->H * (1 + (size_t)m->n_deepstack) * sizeof(float);
}

static vlmd_status reserve_buf(lm_ranks *g, size_t bytes, vlmd_error *err)
{
    if (bytes <= g->cap)
        return VLMD_OK;
    unsigned char *p = realloc(g->buf, bytes);
    if (!p)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for a step's batch of %zu bytes",
                           bytes);
    g->buf = p;
    g->cap = bytes;
    return VLMD_OK;
}

/* Every rank's status of the call just made (mine; its message in err),
 * all-gathered: VLMD_OK when it succeeded everywhere, else the first failing
 * rank's, named in err (a rank above 0's own message stays in its log).
 * *broken (when given): the all-gather itself failed (the group must
 * restart). */
static vlmd_status agree(lm_model *m, vlmd_status mine, const char *what, bool *broken,
                         vlmd_error *err)
{
    lm_ranks *g = m->ranks;
    vlmd_error mine_err = *err;
    g->statuses[m->rank] = (int32_t)mine;
    vlmd_status s = gather(m, g->statuses, sizeof *g->statuses, err);
    if (broken)
        *broken = s != VLMD_OK;
    if (s != VLMD_OK)
        return s;
    for (int r = 0; r < m->world; r++) {
        if (g->statuses[r] == VLMD_OK)
            continue;
        if (r == m->rank) {
            *err = mine_err;
            return mine;
        }
        return vlmd_errorf(err, (vlmd_status)g->statuses[r], "%s failed on rank %d of %d (%s; "
                           "its log says why)", what, r, m->world,
                           vlmd_status_str((vlmd_status)g->statuses[r]));
    }
    return VLMD_OK;
}

/* The device the group shares: the least memory any rank has free after its
 * weights. Rank 0, whose profile sizes every rank's cache, limits its own
 * device to that. */
static vlmd_status agree_device(lm_model *m, vlmd_error *err)
{
    uint64_t free_bytes = 0, total = 0;
    vlmd_status s = vlmd_backend_mem_info(m->b, &free_bytes, &total, err);
    uint64_t *all = calloc((size_t)m->world, sizeof *all);
    if (s == VLMD_OK && !all)
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    if (s == VLMD_OK) {
        all[m->rank] = free_bytes;
        s = gather(m, all, sizeof *all, err);
    }
    uint64_t least = free_bytes;
    int who = m->rank;
    for (int r = 0; s == VLMD_OK && r < m->world; r++)
        if (all[r] < least)
            least = all[r], who = r;
    free(all);
    if (s != VLMD_OK || !m->ranks->leads || least == free_bytes)
        return s;
    VLMD_INFO("ranks: rank %d has the least device memory free after its weights (%llu MiB, "
              "%llu MiB here): the KV cache of every rank is sized for it", who,
              (unsigned long long)(least >> 20), (unsigned long long)(free_bytes >> 20));
    vlmd_backend_limit(m->b, total - (free_bytes - least));
    return VLMD_OK;
}

static vlmd_status start(lm_model *m, bool leads, vlmd_error *err)
{
    if (m->world < 2 || !m->comm)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a model of one rank has no group to %s",
                           leads ? "lead" : "follow");
    VLMD_ASSERT(!m->ranks);
    lm_ranks *g = calloc(1, sizeof *g);
    int32_t *statuses = calloc((size_t)m->world, sizeof *statuses);
    if (!g || !statuses) {
        free(g);
        free(statuses);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    g->leads = leads;
    g->statuses = statuses;
    m->ranks = g;
    vlmd_status s = VLMD_OK;
    if (vlmd_backend_info(m->b)->kind != VLMD_DEVICE_CPU)
        s = vlmd_backend_alloc(m->b, RANKS_STAGE_BYTES, &g->stage, err);
    return s == VLMD_OK ? agree_device(m, err) : s;
}

void lm_ranks_free(lm_model *m)
{
    lm_ranks *g = m->ranks;
    if (!g)
        return;
    if (g->leads) { /* the others' lm_follow returns */
        ranks_cmd stop = {RANKS_MAGIC, OP_STOP, 0, 0, 0, 0, 0, 0, 0};
        vlmd_error ignored = {0};
        broadcast(m, &stop, sizeof stop, &ignored);
    }
    m->ranks = NULL;
    for (int i = 0; i < RANKS_MAX_HANDLES; i++) {
        lm_kv_free_here(m, g->kvs[i].p);
        lm_workspace_free_here(m, g->wss[i].p);
    }
    vlmd_backend_free(m->b, g->stage, RANKS_STAGE_BYTES);
    free(g->buf);
    free(g->statuses);
    free(g);
}

/* ---- rank 0 ------------------------------------------------------------------- */

static bool leads(const lm_model *m)
{
    return m->ranks && m->ranks->leads;
}

static vlmd_status send_cmd(lm_model *m, ranks_cmd c, vlmd_error *err)
{
    c.magic = RANKS_MAGIC;
    return broadcast(m, &c, sizeof c, err);
}

vlmd_status lm_lead(lm_model *m, vlmd_error *err)
{
    return start(m, true, err);
}

vlmd_status lm_ping(lm_model *m, vlmd_error *err)
{
    return leads(m) ? send_cmd(m, (ranks_cmd){.op = OP_PING}, err) : VLMD_OK;
}

vlmd_status lm_ranks_kv_create(lm_model *m, int32_t n_slots, int32_t n_state_slots, lm_kv **out,
                               vlmd_error *err)
{
    *out = NULL;
    if (!leads(m))
        return lm_kv_create_here(m, n_slots, n_state_slots, out, err);
    uint32_t id = ++m->ranks->next_id;
    vlmd_status s = send_cmd(m, (ranks_cmd){.op = OP_KV_CREATE, .kv = id, .a = n_slots,
                                            .b = n_state_slots}, err);
    if (s != VLMD_OK)
        return s;
    lm_kv *kv = NULL;
    s = agree(m, lm_kv_create_here(m, n_slots, n_state_slots, &kv, err), "the KV cache", NULL,
              err);
    if (s != VLMD_OK) {
        lm_kv_free_here(m, kv);
        return s;
    }
    kv->id = id;
    *out = kv;
    return VLMD_OK;
}

void lm_ranks_kv_free(lm_model *m, lm_kv *kv)
{
    vlmd_error ignored = {0}; /* a broken group is restarted whole */
    if (kv && leads(m))
        send_cmd(m, (ranks_cmd){.op = OP_KV_FREE, .kv = kv->id}, &ignored);
    lm_kv_free_here(m, kv);
}

vlmd_status lm_ranks_workspace_create(lm_model *m, int32_t max_tokens, int32_t max_logits,
                                         int32_t max_kv_len, lm_workspace **out,
                                         vlmd_error *err)
{
    *out = NULL;
    if (!leads(m))
        return lm_workspace_create_here(m, max_tokens, max_logits, max_kv_len, out, err);
    uint32_t id = ++m->ranks->next_id;
    vlmd_status s = send_cmd(m, (ranks_cmd){.op = OP_WS_CREATE, .ws = id, .a = max_tokens,
                                            .b = max_logits, .c = max_kv_len}, err);
    if (s != VLMD_OK)
        return s;
    lm_workspace *ws = NULL;
    s = lm_workspace_create_here(m, max_tokens, max_logits, max_kv_len, &ws, err);
    if (s == VLMD_OK)
        s = reserve_buf(m->ranks, batch_capacity(m, ws), err);
    s = agree(m, s, "the workspace", NULL, err);
    if (s != VLMD_OK) {
        lm_workspace_free_here(m, ws);
        return s;
    }
    ws->id = id;
    *out = ws;
    return VLMD_OK;
}

void lm_ranks_workspace_free(lm_model *m, lm_workspace *ws)
{
    vlmd_error ignored = {0};
    if (ws && leads(m))
        send_cmd(m, (ranks_cmd){.op = OP_WS_FREE, .ws = ws->id}, &ignored);
    lm_workspace_free_here(m, ws);
}

/* Appends n bytes at *at in the group's buffer (sized for the workspace). */
static void put(unsigned char *buf, size_t *at, const void *src, size_t n)
{
    if (n)
        memcpy(buf + *at, src, n);
    *at += n;
}

vlmd_status lm_ranks_forward(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                const lm_batch *bt, vlmd_error *err)
{
    if (!leads(m))
        return VLMD_OK;
    /* a batch this rank refuses is refused before the others hear of it */
    vlmd_status s = lm_check_batch(m, kv, ws, bt, err);
    if (s != VLMD_OK)
        return s;
    lm_ranks *g = m->ranks;
    size_t at = 0, i32 = sizeof(int32_t), n = (size_t)bt->n_tokens;
    put(g->buf, &at, bt->ids, n * i32);
    put(g->buf, &at, bt->positions, 3 * n * i32);
    put(g->buf, &at, bt->slots, n * i32);
    put(g->buf, &at, bt->logit_rows, (size_t)bt->n_logits * i32);
    for (int q = 0; q < bt->n_seqs; q++) {
        const vlmd_attn_seq *sq = &bt->seqs[q];
        int32_t shape[3] = {sq->q_start, sq->q_len, sq->kv_len};
        put(g->buf, &at, shape, sizeof shape);
    }
    if (m->n_linear) /* a hybrid model's state slots */
        put(g->buf, &at, bt->state_slots, (size_t)bt->n_seqs * i32);
    for (int q = 0; q < bt->n_seqs; q++)
        put(g->buf, &at, bt->seqs[q].slots, (size_t)bt->seqs[q].kv_len * i32);
    for (int e = 0; e < bt->n_embeds; e++) {
        int32_t rows[2] = {bt->embeds[e].row, bt->embeds[e].n_rows};
        put(g->buf, &at, rows, sizeof rows);
    }
    for (int e = 0; e < bt->n_embeds; e++) { /* each run's rows, then each feature's */
        const lm_embed_run *r = &bt->embeds[e];
        for (int k = 0; k <= m->n_deepstack; k++)
            put(g->buf, &at, r->data + (size_t)k * r->feature_stride,
                (size_t)r->n_rows * m->H * sizeof(float));
    }
    VLMD_ASSERT(at <= g->cap);
    s = send_cmd(m, (ranks_cmd){.op = OP_FORWARD, .kv = kv->id, .ws = ws->id, .a = bt->n_tokens,
                                .b = bt->n_seqs, .c = bt->n_logits, .d = bt->n_embeds,
                                .payload = at}, err);
    return s == VLMD_OK ? broadcast(m, g->buf, at, err) : s;
}

vlmd_status lm_ranks_state_copy(lm_model *m, lm_kv *kv, int32_t from, int32_t to,
                                vlmd_error *err)
{
    if (!leads(m))
        return VLMD_OK;
    if (from < 0 || to < 0 || from >= kv->n_state_slots || to >= kv->n_state_slots)
        return lm_state_copy_here(m, kv, from, to, err); /* its refusal, the others untold */
    return send_cmd(m, (ranks_cmd){.op = OP_STATE_COPY, .kv = kv->id, .a = from, .b = to}, err);
}

vlmd_status lm_ranks_capture_decode(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                       vlmd_error *err)
{
    if (!leads(m))
        return lm_capture_decode_here(m, kv, ws, err);
    vlmd_status s = send_cmd(m, (ranks_cmd){.op = OP_CAPTURE, .kv = kv->id, .ws = ws->id}, err);
    if (s != VLMD_OK)
        return s;
    return agree(m, lm_capture_decode_here(m, kv, ws, err), "capturing the decode graphs",
                 NULL, err);
}

/* ---- the other ranks ------------------------------------------------------------ */

static handle *find(handle *table, uint32_t id)
{
    for (int i = 0; i < RANKS_MAX_HANDLES; i++)
        if (table[i].p && table[i].id == id)
            return &table[i];
    return NULL;
}

static vlmd_status unknown(uint32_t id, const char *what, vlmd_error *err)
{
    return vlmd_errorf(err, VLMD_ERR_PROTO, "rank 0 named %s %u, which this rank does not hold",
                       what, id);
}

/* A step as rank 0 sent it: the batch rebuilt over the received bytes. */
static vlmd_status follow_forward(lm_model *m, const ranks_cmd *c, vlmd_error *err)
{
    lm_ranks *g = m->ranks;
    handle *kv = find(g->kvs, c->kv), *ws = find(g->wss, c->ws);
    if (!kv || !ws)
        return unknown(kv ? c->ws : c->kv, kv ? "workspace" : "KV cache", err);
    if (c->payload > g->cap || c->a < 1 || c->b < 0 || c->c < 0 || c->d < 0 ||
        c->b > ((lm_workspace *)ws->p)->max_logits || c->d > c->a)
        return vlmd_errorf(err, VLMD_ERR_PROTO, "a step of %d tokens, %d sequences and %llu "
                           "bytes does not fit this rank's workspace", c->a, c->b,
                           (unsigned long long)c->payload);
    vlmd_status s = broadcast(m, g->buf, c->payload, err);
    if (s != VLMD_OK)
        return s;
    size_t n = (size_t)c->a, words = c->payload / sizeof(int32_t);
    int32_t *p = (int32_t *)g->buf;
    vlmd_attn_seq seqs[((lm_workspace *)ws->p)->max_logits + 1];
    lm_embed_run runs[c->d + 1];
    lm_batch bt = {.n_tokens = c->a, .ids = p, .positions = p + n, .slots = p + 4 * n,
                      .logit_rows = p + 5 * n, .n_logits = c->c, .seqs = seqs, .n_seqs = c->b,
                      .embeds = runs, .n_embeds = c->d};
    /* rank 0 checked the batch; what is checked here is that its bytes hold it */
    size_t states = m->n_linear ? (size_t)c->b : 0;
    size_t used = 5 * n + (size_t)c->c + 3 * (size_t)c->b + states;
    int32_t *shape = p + 5 * n + c->c, *slots = shape + 3 * (size_t)c->b + states;
    bt.state_slots = states ? shape + 3 * (size_t)c->b : NULL;
    for (int q = 0; q < c->b && used <= words; q++) {
        seqs[q] = (vlmd_attn_seq){shape[3 * q], shape[3 * q + 1], shape[3 * q + 2], slots};
        size_t len = shape[3 * q + 2] > 0 ? (size_t)shape[3 * q + 2] : 0;
        slots += len;
        used += len;
    }
    used += 2 * (size_t)c->d;
    if (used > words)
        return vlmd_errorf(err, VLMD_ERR_PROTO, "a step's %llu bytes do not hold its batch",
                           (unsigned long long)c->payload);
    const float *data = (const float *)(slots + 2 * (size_t)c->d);
    for (int e = 0; e < c->d; e++) {
        size_t block = (size_t)slots[2 * e + 1] * m->H;
        runs[e] = (lm_embed_run){slots[2 * e], slots[2 * e + 1], data, block};
        data += block * (1 + (size_t)m->n_deepstack);
    }
    if ((const unsigned char *)data - g->buf != (ptrdiff_t)c->payload)
        return vlmd_errorf(err, VLMD_ERR_PROTO, "a step's %llu bytes do not hold its batch",
                           (unsigned long long)c->payload);
    return lm_forward_here(m, kv->p, ws->p, &bt, NULL, err);
}

/* A create rank 0 asked for, agreed; the new one kept under its id. */
static vlmd_status follow_create(lm_model *m, const ranks_cmd *c, vlmd_error *err)
{
    lm_ranks *g = m->ranks;
    bool is_kv = c->op == OP_KV_CREATE;
    handle *table = is_kv ? g->kvs : g->wss, *slot = NULL;
    for (int i = 0; !slot && i < RANKS_MAX_HANDLES; i++)
        slot = table[i].p ? NULL : &table[i];
    void *made = NULL;
    vlmd_error mine = {0};
    vlmd_status s = slot ? VLMD_OK
                         : vlmd_errorf(&mine, VLMD_ERR_INVALID_ARG, "more than %d held at once",
                                       RANKS_MAX_HANDLES);
    if (s == VLMD_OK && is_kv)
        s = lm_kv_create_here(m, c->a, c->b, (lm_kv **)&made, &mine);
    else if (s == VLMD_OK) {
        s = lm_workspace_create_here(m, c->a, c->b, c->c, (lm_workspace **)&made, &mine);
        if (s == VLMD_OK)
            s = reserve_buf(g, batch_capacity(m, made), &mine);
    }
    if (s != VLMD_OK)
        VLMD_ERROR("ranks: %s: %s", is_kv ? "the KV cache" : "the workspace", mine.msg);
    *err = mine;
    bool broken;
    s = agree(m, s, is_kv ? "the KV cache" : "the workspace", &broken, err);
    if (s != VLMD_OK) { /* failed somewhere: nobody keeps one, and rank 0 tries again or stops */
        if (is_kv)
            lm_kv_free_here(m, made);
        else
            lm_workspace_free_here(m, made);
        return broken ? s : VLMD_OK;
    }
    *slot = (handle){is_kv ? c->kv : c->ws, made};
    return VLMD_OK;
}

void lm_follower_holds(lm_model *m, int32_t *kv_slots, uint64_t *bytes)
{
    *kv_slots = atomic_load(&m->followed_slots);
    *bytes = atomic_load(&m->followed_bytes);
}

/* What lm_follower_holds reports, after a create or a free. */
static void note_held(lm_model *m)
{
    int32_t slots = 0;
    for (int i = 0; i < RANKS_MAX_HANDLES; i++)
        slots += m->ranks->kvs[i].p ? ((lm_kv *)m->ranks->kvs[i].p)->n_slots : 0;
    atomic_store(&m->followed_slots, slots);
    atomic_store(&m->followed_bytes, vlmd_backend_allocated_bytes(m->b));
}

vlmd_status lm_follow(lm_model *m, vlmd_error *err)
{
    vlmd_status s = start(m, false, err);
    lm_ranks *g = m->ranks;
    if (s == VLMD_OK)
        note_held(m);
    while (s == VLMD_OK) {
        ranks_cmd c = {0};
        if ((s = broadcast(m, &c, sizeof c, err)) != VLMD_OK)
            break;
        if (c.magic != RANKS_MAGIC) {
            s = vlmd_errorf(err, VLMD_ERR_PROTO, "rank 0 sent a command this rank does not "
                            "read (magic %08x)", c.magic);
            break;
        }
        handle *h = NULL;
        switch ((ranks_op)c.op) {
        case OP_PING:
            break;
        case OP_STOP:
            return VLMD_OK;
        case OP_KV_CREATE:
        case OP_WS_CREATE:
            s = follow_create(m, &c, err);
            note_held(m);
            break;
        case OP_KV_FREE:
        case OP_WS_FREE:
            h = find(c.op == OP_KV_FREE ? g->kvs : g->wss, c.op == OP_KV_FREE ? c.kv : c.ws);
            if (!h) {
                s = unknown(c.op == OP_KV_FREE ? c.kv : c.ws,
                            c.op == OP_KV_FREE ? "KV cache" : "workspace", err);
                break;
            }
            if (c.op == OP_KV_FREE)
                lm_kv_free_here(m, h->p);
            else
                lm_workspace_free_here(m, h->p);
            *h = (handle){0};
            note_held(m);
            break;
        case OP_FORWARD:
            s = follow_forward(m, &c, err);
            break;
        case OP_STATE_COPY:
            h = find(g->kvs, c.kv);
            s = h ? lm_state_copy_here(m, h->p, c.a, c.b, err) : unknown(c.kv, "KV cache", err);
            break;
        case OP_CAPTURE: {
            handle *kv = find(g->kvs, c.kv), *ws = find(g->wss, c.ws);
            vlmd_error mine = {0};
            vlmd_status made = kv && ws ? lm_capture_decode_here(m, kv->p, ws->p, &mine)
                                        : unknown(c.kv, "KV cache or workspace", &mine);
            *err = mine;
            bool broken;
            s = agree(m, made, "capturing the decode graphs", &broken, err);
            s = broken ? s : VLMD_OK; /* a failure anywhere: rank 0 fails the attempt */
            break;
        }
        default:
            s = vlmd_errorf(err, VLMD_ERR_PROTO, "rank 0 sent command %u, which this rank "
                            "does not know", c.op);
            break;
        }
    }
    return s;
}
