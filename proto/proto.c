/* proto.c - msgpack encode/decode of every vlmd message (see proto.h).
 *
 * Table-driven: each message body and nested struct is described once by a
 * list of fields (key, kind, offset, limit); one walker encodes, one decodes,
 * one frees. A decode runs in three steps, each rejecting before trusting:
 *   1. prescan: walk the raw bytes without allocating; every declared length
 *      and element count must fit in the bytes left (msgpack-c allocates for a
 *      declared count before it sees the elements), nesting <= PROTO_MAX_DEPTH,
 *      objects <= PROTO_MAX_OBJECTS, no ext types, no trailing bytes;
 *   2. msgpack-c unpacks into an object tree;
 *   3. the tree is checked field by field against the table: types, ranges,
 *      enum values, lengths, duplicate keys; unknown keys are ignored.
 * Any failure frees what was built and leaves the message zeroed.
 *
 * Optional fields (absent on the wire = the default; every other field is
 * required, and the encoder always writes every field):
 *
 *   field                    in                          absent means
 *   message                  token_chunk, image_result   ""
 *   device, listen_url       ready, worker               ""
 *   logprobs                 token_chunk                 none (NULL, 0)
 *   top_n                    token_chunk                 0
 *   top_ids, top_logprobs    token_chunk                 none (NULL, 0)
 *   kv_used_tokens           heartbeat, worker           0
 *   data                     image (ref)                 none (NULL, 0)
 *   error_image              token_chunk                 0
 *   memory                   ready, worker               none (NULL, 0)
 *   settings                 ready                       none (NULL, 0)
 *   counters                 heartbeat, worker           none (NULL, 0)
 *   session                  request_submit              ""
 *   ignore_eos               request_submit              false
 *   logit_bias               request_submit              none (NULL, 0)
 *   min_tokens               request_submit              0
 *   grammar                  request_submit              kind NONE (free text)
 *   max_tokens_capped        token_chunk                 0
 *   engine                   token_chunk                 0
 *   cached_tokens            token_chunk                 0
 *   grammar_closed           token_chunk                 0
 *   pooling, pool_ids        request_submit              NONE, none (NULL, 0)
 *   pooled                   token_chunk                 none (NULL, 0)
 *   arena_offset, token_count image_job                  0
 *
 * sampling.seed stays required: has_seed travels beside it since version 1,
 * and reading an absent seed as "no seed" would give that field two meanings.
 * Fields added later must be optional so that an older sender is understood.
 *
 * Status codes: decode returns VLMD_ERR_PROTO for a malformed message,
 * VLMD_ERR_TOO_LARGE for an array, map, binary or whole message over its
 * limit, VLMD_ERR_VERSION for another version; encode returns
 * VLMD_ERR_INVALID_ARG for anything decode would reject, so whatever encodes
 * also decodes. */
#include "proto.h"

#include <float.h>
#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROTO_MAX_DEPTH 16          /* the deepest message nests 5 */
#define PROTO_MAX_BODY_KEYS 64      /* entries in one body or nested map */
/* Objects in one message: a token chunk at its limits holds 4 arrays of
 * VLMD_PROTO_MAX_TOKENS; the rest is small. Bounds msgpack-c's object tree
 * (24 bytes an object) to about 100 MiB whatever the frame holds. */
#define PROTO_MAX_OBJECTS (4u * VLMD_PROTO_MAX_TOKENS + (1u << 16))

/* ---- names ---------------------------------------------------------------- */

static const char *const msg_type_names[VLMD_MSG_TYPE_MAX + 1] = {
    [VLMD_MSG_HELLO] = "hello",
    [VLMD_MSG_WELCOME] = "welcome",
    [VLMD_MSG_READY] = "ready",
    [VLMD_MSG_HEARTBEAT] = "heartbeat",
    [VLMD_MSG_FOOTPRINT_REQUEST] = "footprint_request",
    [VLMD_MSG_FOOTPRINT_REPLY] = "footprint_reply",
    [VLMD_MSG_GROUP_ID] = "group_id",
    [VLMD_MSG_WORKER_EXIT] = "worker_exit",
    [VLMD_MSG_STATS_SNAPSHOT] = "stats_snapshot",
    [VLMD_MSG_SHUTDOWN] = "shutdown",
    [VLMD_MSG_REQUEST_SUBMIT] = "request_submit",
    [VLMD_MSG_REQUEST_CANCEL] = "request_cancel",
    [VLMD_MSG_TOKEN_CHUNK] = "token_chunk",
    [VLMD_MSG_IMAGE_JOB] = "image_job",
    [VLMD_MSG_IMAGE_RESULT] = "image_result",
    [VLMD_MSG_RESTARTS] = "restarts",
};

static bool msg_type_known(uint64_t t)
{
    return t >= 1 && t <= VLMD_MSG_TYPE_MAX;
}

const char *vlmd_msg_type_str(vlmd_msg_type t)
{
    return msg_type_known((uint64_t)t) ? msg_type_names[t] : "?";
}

const char *vlmd_grammar_kind_str(vlmd_grammar_kind k)
{
    static const char *const names[VLMD_GRAMMAR_KIND_COUNT] = {
        "none", "json_schema", "json_object", "regex", "choice", "tool_calls"};
    return (unsigned)k < VLMD_GRAMMAR_KIND_COUNT ? names[k] : "?";
}

const char *vlmd_worker_state_str(vlmd_worker_state s)
{
    static const char *const names[VLMD_WORKER_STATE_COUNT] = {"down", "starting", "ready"};
    return (unsigned)s < VLMD_WORKER_STATE_COUNT ? names[s] : "?";
}

const char *vlmd_finish_reason_str(vlmd_finish_reason r)
{
    static const char *const names[VLMD_FINISH_COUNT] = {"none", "stop", "length",
                                                          "cancelled", "error"};
    return (unsigned)r < VLMD_FINISH_COUNT ? names[r] : "?";
}

/* ---- the tables ----------------------------------------------------------- */

typedef enum field_kind {
    F_U32,          /* uint32_t <= limit (enums: count - 1) */
    F_U64,          /* uint64_t */
    F_I32,          /* int32_t */
    F_I64,          /* int64_t */
    F_BOOL,
    F_F64,          /* finite double; decode also takes float32 and integers */
    F_STR,          /* char *, owned, no NUL, at most VLMD_PROTO_MAX_STR bytes */
    F_HASH,         /* uint8_t[32], as bin of exactly 32 bytes */
    F_BIN,          /* uint8_t * + uint32_t count <= limit */
    F_U32_ARRAY,    /* uint32_t * + uint32_t count <= limit */
    F_F32_ARRAY,    /* float * + uint32_t count <= limit */
    F_KV,           /* vlmd_kv * + uint32_t count <= limit: a map of str -> str */
    F_STRUCT,       /* an embedded struct, as a nested map */
    F_STRUCT_ARRAY, /* pointer to structs + uint32_t count <= limit */
} field_kind;

typedef struct struct_desc struct_desc;

typedef struct field_desc {
    const char *key;
    field_kind kind;
    bool optional;
    size_t offset;          /* of the value (or of the pointer) */
    size_t count_offset;    /* of the uint32_t count, for arrays (never 0 for them) */
    uint64_t limit;         /* max value (F_U32) or max count (arrays, bin, map) */
    const struct_desc *sub; /* F_STRUCT, F_STRUCT_ARRAY */
} field_desc;

struct struct_desc {
    const char *name;
    size_t size;
    const field_desc *fields;
    size_t n_fields;
};

#define U32(T, f) {#f, F_U32, false, offsetof(T, f), 0, UINT32_MAX, NULL}
#define U32_MAX(T, f, max, opt) {#f, F_U32, opt, offsetof(T, f), 0, (max), NULL}
#define ENUM(T, f, count) {#f, F_U32, false, offsetof(T, f), 0, (count) - 1, NULL}
#define FLD(T, f, kind) {#f, kind, false, offsetof(T, f), 0, 0, NULL}
#define OPT(T, f, kind) {#f, kind, true, offsetof(T, f), 0, 0, NULL}
#define ARR(T, f, n, kind, lim) {#f, kind, false, offsetof(T, f), offsetof(T, n), (lim), NULL}
#define OPT_ARR(T, f, n, kind, lim) {#f, kind, true, offsetof(T, f), offsetof(T, n), (lim), NULL}
#define SUB(T, f, d) {#f, F_STRUCT, false, offsetof(T, f), 0, 0, &(d)}
#define OPT_SUB(T, f, d) {#f, F_STRUCT, true, offsetof(T, f), 0, 0, &(d)}
#define SUB_ARR(T, f, n, d, lim)                                                                \
    {#f, F_STRUCT_ARRAY, false, offsetof(T, f), offsetof(T, n), (lim), &(d)}
#define OPT_SUB_ARR(T, f, n, d, lim)                                                            \
    {#f, F_STRUCT_ARRAY, true, offsetof(T, f), offsetof(T, n), (lim), &(d)}
#define DESC(T, name, fields) {name, sizeof(T), fields, sizeof fields / sizeof fields[0]}

static const field_desc hello_fields[] = {
    ENUM(vlmd_msg_hello, role, VLMD_ROLE_COUNT),
    U32(vlmd_msg_hello, rank),
    FLD(vlmd_msg_hello, pid, F_I64),
    FLD(vlmd_msg_hello, start_wall_ms, F_U64),
    FLD(vlmd_msg_hello, version, F_STR),
    ARR(vlmd_msg_hello, config, n_config, F_KV, VLMD_PROTO_MAX_CONFIG),
};
static const field_desc welcome_fields[] = {
    FLD(vlmd_msg_welcome, known, F_BOOL),
    FLD(vlmd_msg_welcome, router_pid, F_I64),
};
static const field_desc ready_fields[] = {
    ENUM(vlmd_msg_ready, role, VLMD_ROLE_COUNT),
    U32(vlmd_msg_ready, rank),
    FLD(vlmd_msg_ready, reserved_bytes, F_U64),
    FLD(vlmd_msg_ready, kv_capacity_tokens, F_U64),
    OPT(vlmd_msg_ready, device, F_STR),
    OPT(vlmd_msg_ready, listen_url, F_STR),
    OPT_ARR(vlmd_msg_ready, memory, n_memory, F_KV, VLMD_PROTO_MAX_CONFIG),
    OPT_ARR(vlmd_msg_ready, settings, n_settings, F_KV, VLMD_PROTO_MAX_CONFIG),
};
static const field_desc heartbeat_fields[] = {
    ENUM(vlmd_msg_heartbeat, role, VLMD_ROLE_COUNT),
    U32(vlmd_msg_heartbeat, rank),
    FLD(vlmd_msg_heartbeat, pid, F_I64),
    ENUM(vlmd_msg_heartbeat, state, VLMD_WORKER_STATE_COUNT),
    FLD(vlmd_msg_heartbeat, seq, F_U64),
    OPT(vlmd_msg_heartbeat, kv_used_tokens, F_U64),
    OPT_ARR(vlmd_msg_heartbeat, counters, n_counters, F_KV, VLMD_PROTO_MAX_CONFIG),
};
static const field_desc footprint_request_fields[] = {
    U32(vlmd_msg_footprint_request, rank),
};
static const field_desc footprint_reply_fields[] = {
    FLD(vlmd_msg_footprint_reply, peer_bytes, F_U64),
};
static const field_desc worker_exit_fields[] = {
    ENUM(vlmd_msg_worker_exit, role, VLMD_ROLE_COUNT),
    U32(vlmd_msg_worker_exit, rank),
    FLD(vlmd_msg_worker_exit, pid, F_I64),
    FLD(vlmd_msg_worker_exit, exit_status, F_I32),
    FLD(vlmd_msg_worker_exit, term_signal, F_I32),
};
static const field_desc worker_info_fields[] = {
    ENUM(vlmd_worker_info, role, VLMD_ROLE_COUNT),
    U32(vlmd_worker_info, rank),
    ENUM(vlmd_worker_info, state, VLMD_WORKER_STATE_COUNT),
    FLD(vlmd_worker_info, pid, F_I64),
    FLD(vlmd_worker_info, uptime_ms, F_U64),
    U32(vlmd_worker_info, restarts),
    FLD(vlmd_worker_info, reserved_bytes, F_U64),
    FLD(vlmd_worker_info, kv_capacity_tokens, F_U64),
    FLD(vlmd_worker_info, version, F_STR),
    OPT(vlmd_worker_info, device, F_STR),
    OPT(vlmd_worker_info, listen_url, F_STR),
    ARR(vlmd_worker_info, config, n_config, F_KV, VLMD_PROTO_MAX_CONFIG),
    OPT(vlmd_worker_info, kv_used_tokens, F_U64),
    OPT_ARR(vlmd_worker_info, memory, n_memory, F_KV, VLMD_PROTO_MAX_CONFIG),
    OPT_ARR(vlmd_worker_info, counters, n_counters, F_KV, VLMD_PROTO_MAX_CONFIG),
};
static const struct_desc worker_info_desc = DESC(vlmd_worker_info, "worker", worker_info_fields);
static const field_desc stats_snapshot_fields[] = {
    FLD(vlmd_msg_stats_snapshot, seq, F_U64),
    FLD(vlmd_msg_stats_snapshot, dropped_messages, F_U64),
    SUB_ARR(vlmd_msg_stats_snapshot, workers, n_workers, worker_info_desc,
            VLMD_PROTO_MAX_WORKERS),
};
static const field_desc shutdown_fields[] = {
    FLD(vlmd_msg_shutdown, reason, F_STR),
    FLD(vlmd_msg_shutdown, drain_ms, F_U64),
};
static const field_desc sampling_fields[] = {
    FLD(vlmd_sampling, temperature, F_F64),
    FLD(vlmd_sampling, top_p, F_F64),
    FLD(vlmd_sampling, top_k, F_I32),
    FLD(vlmd_sampling, min_p, F_F64),
    FLD(vlmd_sampling, presence_penalty, F_F64),
    FLD(vlmd_sampling, frequency_penalty, F_F64),
    FLD(vlmd_sampling, repetition_penalty, F_F64),
    FLD(vlmd_sampling, seed, F_U64),
    FLD(vlmd_sampling, has_seed, F_BOOL),
};
static const struct_desc sampling_desc = DESC(vlmd_sampling, "sampling", sampling_fields);
static const field_desc image_ref_fields[] = {
    FLD(vlmd_image_ref, hash, F_HASH),
    U32(vlmd_image_ref, token_offset),
    U32(vlmd_image_ref, token_count),
    FLD(vlmd_image_ref, arena_offset, F_U64),
    U32(vlmd_image_ref, grid_t),
    U32(vlmd_image_ref, grid_h),
    U32(vlmd_image_ref, grid_w),
    OPT_ARR(vlmd_image_ref, data, n_data, F_BIN, VLMD_PROTO_MAX_IMAGE_BYTES),
};
static const struct_desc image_ref_desc = DESC(vlmd_image_ref, "image", image_ref_fields);
static const field_desc logit_bias_fields[] = {
    U32(vlmd_logit_bias, id),
    FLD(vlmd_logit_bias, bias, F_F64),
};
static const struct_desc logit_bias_desc = DESC(vlmd_logit_bias, "logit_bias", logit_bias_fields);
static const field_desc grammar_fields[] = {
    ENUM(vlmd_request_grammar, kind, VLMD_GRAMMAR_KIND_COUNT),
    ARR(vlmd_request_grammar, text, n_text, F_BIN, VLMD_PROTO_MAX_GRAMMAR_BYTES),
    FLD(vlmd_request_grammar, trigger, F_I64),
    FLD(vlmd_request_grammar, trigger_after, F_I64),
};
static const struct_desc grammar_desc = DESC(vlmd_request_grammar, "grammar", grammar_fields);
static const field_desc request_submit_fields[] = {
    FLD(vlmd_msg_request_submit, req_id, F_U64),
    ARR(vlmd_msg_request_submit, tokens, n_tokens, F_U32_ARRAY, VLMD_PROTO_MAX_TOKENS),
    U32(vlmd_msg_request_submit, max_tokens),
    SUB(vlmd_msg_request_submit, sampling, sampling_desc),
    ARR(vlmd_msg_request_submit, stop_tokens, n_stop_tokens, F_U32_ARRAY, VLMD_PROTO_MAX_STOPS),
    U32_MAX(vlmd_msg_request_submit, top_logprobs, VLMD_MAX_TOP_LOGPROBS, false),
    FLD(vlmd_msg_request_submit, logprobs, F_BOOL),
    SUB_ARR(vlmd_msg_request_submit, images, n_images, image_ref_desc, VLMD_PROTO_MAX_IMAGES),
    OPT(vlmd_msg_request_submit, session, F_STR),
    OPT(vlmd_msg_request_submit, ignore_eos, F_BOOL),
    OPT_SUB_ARR(vlmd_msg_request_submit, logit_bias, n_logit_bias, logit_bias_desc,
                VLMD_PROTO_MAX_LOGIT_BIAS),
    U32_MAX(vlmd_msg_request_submit, min_tokens, UINT32_MAX, true),
    OPT_SUB(vlmd_msg_request_submit, grammar, grammar_desc),
    U32_MAX(vlmd_msg_request_submit, pooling, VLMD_POOL_COUNT - 1, true),
    OPT_ARR(vlmd_msg_request_submit, pool_ids, n_pool_ids, F_U32_ARRAY, VLMD_PROTO_MAX_POOL_IDS),
};
static const field_desc request_cancel_fields[] = {
    FLD(vlmd_msg_request_cancel, req_id, F_U64),
    ENUM(vlmd_msg_request_cancel, reason, VLMD_FINISH_COUNT),
};
static const field_desc token_chunk_fields[] = {
    FLD(vlmd_msg_token_chunk, req_id, F_U64),
    ARR(vlmd_msg_token_chunk, tokens, n_tokens, F_U32_ARRAY, VLMD_PROTO_MAX_TOKENS),
    OPT_ARR(vlmd_msg_token_chunk, logprobs, n_logprobs, F_F32_ARRAY, VLMD_PROTO_MAX_TOKENS),
    ENUM(vlmd_msg_token_chunk, finish, VLMD_FINISH_COUNT),
    ENUM(vlmd_msg_token_chunk, status, VLMD_STATUS_COUNT),
    OPT(vlmd_msg_token_chunk, message, F_STR),
    U32(vlmd_msg_token_chunk, prompt_tokens),
    U32(vlmd_msg_token_chunk, completion_tokens),
    U32_MAX(vlmd_msg_token_chunk, cached_tokens, UINT32_MAX, true),
    U32_MAX(vlmd_msg_token_chunk, top_n, VLMD_MAX_TOP_LOGPROBS, true),
    OPT_ARR(vlmd_msg_token_chunk, top_ids, n_top_ids, F_U32_ARRAY, VLMD_PROTO_MAX_TOKENS),
    OPT_ARR(vlmd_msg_token_chunk, top_logprobs, n_top_logprobs, F_F32_ARRAY,
            VLMD_PROTO_MAX_TOKENS),
    U32_MAX(vlmd_msg_token_chunk, error_image, VLMD_PROTO_MAX_IMAGES, true),
    U32_MAX(vlmd_msg_token_chunk, max_tokens_capped, UINT32_MAX, true),
    U32_MAX(vlmd_msg_token_chunk, engine, 15, true),
    U32_MAX(vlmd_msg_token_chunk, grammar_closed, 1, true),
    OPT_ARR(vlmd_msg_token_chunk, pooled, n_pooled, F_F32_ARRAY, VLMD_PROTO_MAX_POOLED),
};
static const field_desc image_job_fields[] = {
    FLD(vlmd_msg_image_job, req_id, F_U64),
    U32(vlmd_msg_image_job, image_index),
    FLD(vlmd_msg_image_job, hash, F_HASH),
    ARR(vlmd_msg_image_job, data, n_data, F_BIN, VLMD_PROTO_MAX_IMAGE_BYTES),
    U32(vlmd_msg_image_job, width),
    U32(vlmd_msg_image_job, height),
    OPT(vlmd_msg_image_job, arena_offset, F_U64),
    U32_MAX(vlmd_msg_image_job, token_count, UINT32_MAX, true),
};
static const field_desc image_result_fields[] = {
    FLD(vlmd_msg_image_result, req_id, F_U64),
    U32(vlmd_msg_image_result, image_index),
    ENUM(vlmd_msg_image_result, status, VLMD_STATUS_COUNT),
    OPT(vlmd_msg_image_result, message, F_STR),
    SUB(vlmd_msg_image_result, image, image_ref_desc),
    FLD(vlmd_msg_image_result, embed_bytes, F_U64),
};
static const field_desc restart_count_fields[] = {
    ENUM(vlmd_restart_count, role, VLMD_ROLE_COUNT),
    U32(vlmd_restart_count, rank),
    U32(vlmd_restart_count, restarts),
};
static const struct_desc restart_count_desc =
    DESC(vlmd_restart_count, "child", restart_count_fields);
static const field_desc group_id_fields[] = {
    U32(vlmd_msg_group_id, rank),
    ARR(vlmd_msg_group_id, id, n_id, F_BIN, VLMD_PROTO_MAX_GROUP_ID_BYTES),
};
static const field_desc restarts_fields[] = {
    SUB_ARR(vlmd_msg_restarts, children, n_children, restart_count_desc, VLMD_PROTO_MAX_WORKERS),
};

#define BODY(type, T, fields) [type] = DESC(T, NULL, fields)
static const struct_desc body_descs[VLMD_MSG_TYPE_MAX + 1] = {
    BODY(VLMD_MSG_HELLO, vlmd_msg_hello, hello_fields),
    BODY(VLMD_MSG_WELCOME, vlmd_msg_welcome, welcome_fields),
    BODY(VLMD_MSG_READY, vlmd_msg_ready, ready_fields),
    BODY(VLMD_MSG_HEARTBEAT, vlmd_msg_heartbeat, heartbeat_fields),
    BODY(VLMD_MSG_FOOTPRINT_REQUEST, vlmd_msg_footprint_request, footprint_request_fields),
    BODY(VLMD_MSG_FOOTPRINT_REPLY, vlmd_msg_footprint_reply, footprint_reply_fields),
    BODY(VLMD_MSG_WORKER_EXIT, vlmd_msg_worker_exit, worker_exit_fields),
    BODY(VLMD_MSG_STATS_SNAPSHOT, vlmd_msg_stats_snapshot, stats_snapshot_fields),
    BODY(VLMD_MSG_SHUTDOWN, vlmd_msg_shutdown, shutdown_fields),
    BODY(VLMD_MSG_REQUEST_SUBMIT, vlmd_msg_request_submit, request_submit_fields),
    BODY(VLMD_MSG_REQUEST_CANCEL, vlmd_msg_request_cancel, request_cancel_fields),
    BODY(VLMD_MSG_TOKEN_CHUNK, vlmd_msg_token_chunk, token_chunk_fields),
    BODY(VLMD_MSG_IMAGE_JOB, vlmd_msg_image_job, image_job_fields),
    BODY(VLMD_MSG_IMAGE_RESULT, vlmd_msg_image_result, image_result_fields),
    BODY(VLMD_MSG_RESTARTS, vlmd_msg_restarts, restarts_fields),
    BODY(VLMD_MSG_GROUP_ID, vlmd_msg_group_id, group_id_fields),
};

#define AT(base, off, T) ((T *)((char *)(base) + (off)))
#define CAT(base, off, T) ((const T *)((const char *)(base) + (off)))

static bool kind_is_pointer(field_kind k)
{
    return k == F_STR || k == F_BIN || k == F_U32_ARRAY || k == F_F32_ARRAY || k == F_KV ||
           k == F_STRUCT_ARRAY;
}

/* The count of an array field; 0 for scalars. */
static uint32_t field_count(const field_desc *f, const void *s)
{
    return f->count_offset ? *CAT(s, f->count_offset, uint32_t) : 0;
}

/* logprobs: none or one per token; alternatives: tokens x top_n, ids and
 * values alike. When they do not fit, says so in why (naming the fields). */
static bool token_chunk_shapes_ok(const vlmd_msg_token_chunk *c, char *why, size_t why_size)
{
    uint64_t alts = (uint64_t)c->n_tokens * c->top_n;
    if ((c->n_logprobs == 0 || c->n_logprobs == c->n_tokens) && c->n_top_ids == alts &&
        c->n_top_logprobs == alts)
        return true;
    snprintf(why, why_size, "%u logprobs, %u top_ids, %u top_logprobs do not fit %u tokens "
             "(logprobs: 0 or one each) x top_n %u", c->n_logprobs, c->n_top_ids,
             c->n_top_logprobs, c->n_tokens, c->top_n);
    return false;
}

/* ---- freeing -------------------------------------------------------------- */

const char *vlmd_kv_get(const vlmd_kv *kv, uint32_t n, const char *key)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(kv[i].key, key) == 0)
            return kv[i].value;
    return NULL;
}

vlmd_kv *vlmd_kv_dup(const vlmd_kv *kv, uint32_t n)
{
    if (!n)
        return NULL;
    vlmd_kv *out = calloc(n, sizeof *out);
    if (!out)
        abort();
    for (uint32_t i = 0; i < n; i++) {
        out[i].key = vlmd_xstrdup(kv[i].key ? kv[i].key : "");
        out[i].value = vlmd_xstrdup(kv[i].value ? kv[i].value : "");
    }
    return out;
}

void vlmd_kv_free(vlmd_kv *kv, uint32_t n)
{
    for (uint32_t i = 0; kv && i < n; i++) {
        free(kv[i].key);
        free(kv[i].value);
    }
    free(kv);
}

/* Frees what struct s owns; s may be partly decoded (unset pointers are NULL). */
static void struct_free(const struct_desc *d, void *s)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const field_desc *f = &d->fields[i];
        uint32_t n = field_count(f, s);
        switch (f->kind) {
        case F_STR:
        case F_BIN:
        case F_U32_ARRAY:
        case F_F32_ARRAY:
            free(*AT(s, f->offset, void *));
            break;
        case F_KV:
            vlmd_kv_free(*AT(s, f->offset, vlmd_kv *), n);
            break;
        case F_STRUCT:
            struct_free(f->sub, AT(s, f->offset, char));
            break;
        case F_STRUCT_ARRAY: {
            char *arr = *AT(s, f->offset, char *);
            for (uint32_t k = 0; arr && k < n; k++)
                struct_free(f->sub, arr + (size_t)k * f->sub->size);
            free(arr);
            break;
        }
        default:
            break;
        }
    }
}

void vlmd_msg_free(vlmd_msg *msg)
{
    if (!msg)
        return;
    if (msg_type_known((uint64_t)msg->type))
        struct_free(&body_descs[msg->type], &msg->u);
    memset(msg, 0, sizeof *msg);
}

void vlmd_msg_take(vlmd_msg *dst, vlmd_msg *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
}

/* ---- encoding ------------------------------------------------------------- */

/* msgpack-c write callback: appends to the vlmd_buf; -1 when it cannot grow. */
static int buf_write(void *data, const char *bytes, size_t len)
{
    return vlmd_buf_append(data, bytes, len) == VLMD_OK ? 0 : -1;
}

/* Turns a msgpack_pack_* result into a status (the only failure is the buffer
 * not growing). */
static vlmd_status packed(int rc, vlmd_error *err)
{
    return rc == 0 ? VLMD_OK : vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory while encoding");
}

static vlmd_status pack_str(msgpack_packer *pk, const char *s, size_t n, vlmd_error *err)
{
    return packed(msgpack_pack_str_with_body(pk, s, n), err);
}

/* Length of s (NULL reads as ""), or VLMD_PROTO_MAX_STR + 1 when longer than allowed. */
static size_t str_len(const char *s)
{
    return s ? strnlen(s, VLMD_PROTO_MAX_STR + 1) : 0;
}

/* Checks a config map the way decode will: no over-long string, no key twice.
 * Fails with VLMD_ERR_INVALID_ARG naming the entry. */
static vlmd_status kv_check(const char *where, const char *key, const vlmd_kv *kv, uint32_t n,
                            vlmd_error *err)
{
    for (uint32_t k = 0; k < n; k++) {
        if (str_len(kv[k].key) > VLMD_PROTO_MAX_STR || str_len(kv[k].value) > VLMD_PROTO_MAX_STR)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: entry %u is over %u bytes",
                               where, key, k, VLMD_PROTO_MAX_STR);
        for (uint32_t j = 0; j < k; j++)
            if (strcmp(kv[j].key ? kv[j].key : "", kv[k].key ? kv[k].key : "") == 0)
                return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: key '%s' appears twice",
                                   where, key, kv[k].key ? kv[k].key : "");
    }
    return VLMD_OK;
}

static vlmd_status struct_encode(const struct_desc *d, const char *name, const void *s,
                                 msgpack_packer *pk, vlmd_error *err);

/* Packs one field's value. Fails with VLMD_ERR_INVALID_ARG (NULL array with
 * a count, count or value over the limit, non-finite double) or
 * VLMD_ERR_NOMEM; what was packed before stays in the buffer for the caller
 * to cut. */
static vlmd_status field_encode(const char *where, const field_desc *f, const void *s,
                                msgpack_packer *pk, vlmd_error *err)
{
    uint32_t n = field_count(f, s);
    const void *ptr = kind_is_pointer(f->kind) ? *CAT(s, f->offset, void *) : NULL;
    if (f->count_offset && n > f->limit)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: %u elements, more than %llu",
                           where, f->key, n, (unsigned long long)f->limit);
    if (f->count_offset && n && !ptr)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: NULL with %u elements", where,
                           f->key, n);
    switch (f->kind) {
    case F_U32: {
        uint32_t v = *CAT(s, f->offset, uint32_t);
        if (v > f->limit)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: %u is over %llu", where,
                               f->key, v, (unsigned long long)f->limit);
        return packed(msgpack_pack_uint32(pk, v), err);
    }
    case F_U64:
        return packed(msgpack_pack_uint64(pk, *CAT(s, f->offset, uint64_t)), err);
    case F_I32:
        return packed(msgpack_pack_int32(pk, *CAT(s, f->offset, int32_t)), err);
    case F_I64:
        return packed(msgpack_pack_int64(pk, *CAT(s, f->offset, int64_t)), err);
    case F_BOOL:
        return packed(*CAT(s, f->offset, bool) ? msgpack_pack_true(pk) : msgpack_pack_false(pk),
                      err);
    case F_F64: {
        double v = *CAT(s, f->offset, double);
        if (!isfinite(v))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s is not finite", where, f->key);
        return packed(msgpack_pack_double(pk, v), err);
    }
    case F_STR: {
        size_t len = str_len(ptr);
        if (len > VLMD_PROTO_MAX_STR)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: string over %u bytes", where,
                               f->key, VLMD_PROTO_MAX_STR);
        return pack_str(pk, ptr ? ptr : "", len, err);
    }
    case F_HASH:
        return packed(msgpack_pack_bin_with_body(pk, CAT(s, f->offset, uint8_t), 32), err);
    case F_BIN:
        return packed(msgpack_pack_bin_with_body(pk, ptr, n), err);
    case F_U32_ARRAY:
    case F_F32_ARRAY: {
        int rc = msgpack_pack_array(pk, n);
        for (uint32_t k = 0; rc == 0 && k < n; k++)
            rc = f->kind == F_U32_ARRAY ? msgpack_pack_uint32(pk, ((const uint32_t *)ptr)[k])
                                        : msgpack_pack_float(pk, ((const float *)ptr)[k]);
        return packed(rc, err);
    }
    case F_KV: {
        const vlmd_kv *kv = ptr;
        vlmd_status st = kv_check(where, f->key, kv, n, err);
        if (st == VLMD_OK)
            st = packed(msgpack_pack_map(pk, n), err);
        for (uint32_t k = 0; st == VLMD_OK && k < n; k++) {
            st = pack_str(pk, kv[k].key ? kv[k].key : "", str_len(kv[k].key), err);
            if (st == VLMD_OK)
                st = pack_str(pk, kv[k].value ? kv[k].value : "", str_len(kv[k].value), err);
        }
        return st;
    }
    case F_STRUCT:
        return struct_encode(f->sub, f->sub->name, CAT(s, f->offset, char), pk, err);
    case F_STRUCT_ARRAY: {
        vlmd_status st = packed(msgpack_pack_array(pk, n), err);
        for (uint32_t k = 0; st == VLMD_OK && k < n; k++)
            st = struct_encode(f->sub, f->sub->name, (const char *)ptr + (size_t)k * f->sub->size,
                               pk, err);
        return st;
    }
    }
    return vlmd_errorf(err, VLMD_ERR_INTERNAL, "%s.%s: unknown field kind", where, f->key);
}

/* Packs struct s as a map of every field; fails like field_encode. */
static vlmd_status struct_encode(const struct_desc *d, const char *name, const void *s,
                                 msgpack_packer *pk, vlmd_error *err)
{
    vlmd_status st = packed(msgpack_pack_map(pk, d->n_fields), err);
    for (size_t i = 0; st == VLMD_OK && i < d->n_fields; i++) {
        const field_desc *f = &d->fields[i];
        st = pack_str(pk, f->key, strlen(f->key), err);
        if (st == VLMD_OK)
            st = field_encode(name, f, s, pk, err);
    }
    return st;
}

vlmd_status vlmd_msg_encode(const vlmd_msg *msg, vlmd_buf *out, vlmd_error *err)
{
    if (!msg || !out)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "encode: NULL message or buffer");
    if (!msg_type_known((uint64_t)msg->type))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "encode: unknown message type %d",
                           (int)msg->type);
    const char *name = msg_type_names[msg->type];
    char why[200];
    if (msg->type == VLMD_MSG_TOKEN_CHUNK &&
        !token_chunk_shapes_ok(&msg->u.token_chunk, why, sizeof why))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "token_chunk: %s", why);
    size_t start = out->len;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    int rc = msgpack_pack_array(&pk, 3);
    if (rc == 0)
        rc = msgpack_pack_uint32(&pk, VLMD_PROTO_VERSION);
    if (rc == 0)
        rc = msgpack_pack_uint32(&pk, (uint32_t)msg->type);
    vlmd_status st = packed(rc, err);
    if (st == VLMD_OK)
        st = struct_encode(&body_descs[msg->type], name, &msg->u, &pk, err);
    if (st == VLMD_OK && out->len - start > VLMD_PROTO_MAX_MSG_BYTES)
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: %zu bytes encoded, more than %u", name,
                         out->len - start, VLMD_PROTO_MAX_MSG_BYTES);
    if (st != VLMD_OK && out->data) {
        out->len = start;
        out->data[start] = '\0';
    }
    return st;
}

/* ---- decoding: errors ------------------------------------------------------ */

typedef struct decoder {
    vlmd_error *err;
    vlmd_status st;     /* the first failure; later ones are not reported */
    char path[128];     /* where we are: "request_submit.images[1]" */
} decoder;

static bool fail(decoder *dc, vlmd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first failure as "<path>: <message>"; always returns false. */
static bool fail(decoder *dc, vlmd_status st, const char *fmt, ...)
{
    if (dc->st != VLMD_OK)
        return false;
    dc->st = st;
    if (dc->err) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        vlmd_errorf(dc->err, st, "%s: %s", dc->path, msg);
    }
    return false;
}

/* Appends ".key" or ".key[index]" (index >= 0) to the path; returns the old
 * length for path_pop(). A path too long for the buffer is cut. */
static size_t path_push(decoder *dc, const char *key, int64_t index)
{
    size_t old = strlen(dc->path);
    if (index < 0)
        snprintf(dc->path + old, sizeof dc->path - old, ".%s", key);
    else
        snprintf(dc->path + old, sizeof dc->path - old, ".%s[%lld]", key, (long long)index);
    return old;
}

static void path_pop(decoder *dc, size_t old)
{
    dc->path[old] = '\0';
}

/* ---- decoding step 1: prescan of the raw bytes ------------------------------ */

/* What the first byte of a msgpack object says follows it. */
typedef struct scan_head {
    int len_bytes;      /* a big-endian length or count of this many bytes follows */
    int per_count;      /* with len_bytes: 0 = it counts payload bytes, 1 = array, 2 = map */
    uint64_t payload;   /* bytes of payload */
    uint64_t items;     /* child objects */
} scan_head;

/* Fills h from type byte b; false for ext types and the reserved 0xc1, which
 * no vlmd message uses. */
static bool scan_head_parse(uint8_t b, scan_head *h)
{
    *h = (scan_head){0};
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return true;                                    /* fixint, nil, bool */
    if (b <= 0x8f) {
        h->items = 2u * (b & 0x0fu);                    /* fixmap */
        return true;
    }
    if (b <= 0x9f) {
        h->items = b & 0x0fu;                           /* fixarray */
        return true;
    }
    if (b <= 0xbf) {
        h->payload = b & 0x1fu;                         /* fixstr */
        return true;
    }
    switch (b) {
    case 0xc4: case 0xd9: h->len_bytes = 1; return true;                 /* bin8, str8 */
    case 0xc5: case 0xda: h->len_bytes = 2; return true;                 /* bin16, str16 */
    case 0xc6: case 0xdb: h->len_bytes = 4; return true;                 /* bin32, str32 */
    case 0xcc: case 0xd0: h->payload = 1; return true;                   /* (u)int8 */
    case 0xcd: case 0xd1: h->payload = 2; return true;                   /* (u)int16 */
    case 0xca: case 0xce: case 0xd2: h->payload = 4; return true;        /* float32, (u)int32 */
    case 0xcb: case 0xcf: case 0xd3: h->payload = 8; return true;        /* float64, (u)int64 */
    case 0xdc: h->len_bytes = 2; h->per_count = 1; return true;          /* array16 */
    case 0xdd: h->len_bytes = 4; h->per_count = 1; return true;          /* array32 */
    case 0xde: h->len_bytes = 2; h->per_count = 2; return true;          /* map16 */
    case 0xdf: h->len_bytes = 4; h->per_count = 2; return true;          /* map32 */
    default: return false;
    }
}

static uint64_t read_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Checks that data holds exactly one msgpack object whose every declared
 * length and count fits in the bytes left, nested at most PROTO_MAX_DEPTH
 * deep, of at most PROTO_MAX_OBJECTS objects. Reads nothing past len and
 * allocates nothing; fails with VLMD_ERR_PROTO (VLMD_ERR_TOO_LARGE for too
 * many objects). */
static bool prescan(decoder *dc, const uint8_t *data, size_t len)
{
    uint64_t pending[PROTO_MAX_DEPTH + 1];  /* objects still to read at each depth */
    int depth = 0;
    size_t pos = 0, objects = 0;
    pending[0] = 1;
    while (depth >= 0) {
        if (pending[depth] == 0) {
            depth--;
            continue;
        }
        pending[depth]--;
        if (pos >= len)
            return fail(dc, VLMD_ERR_PROTO, "truncated: %zu bytes end before the message does",
                        len);
        if (++objects > PROTO_MAX_OBJECTS)
            return fail(dc, VLMD_ERR_TOO_LARGE, "more than %u objects", PROTO_MAX_OBJECTS);
        size_t at = pos;
        scan_head h;
        if (!scan_head_parse(data[pos++], &h))
            return fail(dc, VLMD_ERR_PROTO, "byte %zu: type 0x%02x is not allowed", at,
                        data[at]);
        if (h.len_bytes) {
            if ((size_t)h.len_bytes > len - pos)
                return fail(dc, VLMD_ERR_PROTO, "byte %zu: truncated length", at);
            uint64_t n = read_be(data + pos, h.len_bytes);
            pos += (size_t)h.len_bytes;
            if (h.per_count)
                h.items = n * (uint64_t)h.per_count;
            else
                h.payload = n;
        }
        if (h.payload > len - pos)
            return fail(dc, VLMD_ERR_PROTO, "byte %zu: %llu bytes declared, %zu left", at,
                        (unsigned long long)h.payload, len - pos);
        pos += (size_t)h.payload;
        if (h.items == 0)
            continue;
        if (h.items > len - pos)    /* every element takes at least one byte */
            return fail(dc, VLMD_ERR_PROTO, "byte %zu: %llu elements declared, %zu bytes left",
                        at, (unsigned long long)h.items, len - pos);
        if (depth == PROTO_MAX_DEPTH)
            return fail(dc, VLMD_ERR_PROTO, "byte %zu: nested deeper than %d", at,
                        PROTO_MAX_DEPTH);
        pending[++depth] = h.items;
    }
    if (pos != len)
        return fail(dc, VLMD_ERR_PROTO, "%zu trailing bytes after the message", len - pos);
    return true;
}

/* ---- decoding step 3: the object tree against the tables --------------------- */

static bool key_is(const msgpack_object *k, const char *key)
{
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, key, n) == 0;
}

static bool same_str(const msgpack_object *a, const msgpack_object *b)
{
    /* (an empty string's pointer may be NULL, which memcmp may not be given) */
    return a->via.str.size == b->via.str.size &&
           (a->via.str.size == 0 || memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
}

/* Checks that map o has at most max_entries entries (else VLMD_ERR_TOO_LARGE)
 * with string keys, none twice (else VLMD_ERR_PROTO). */
static bool map_check(decoder *dc, const msgpack_object *o, const char *what,
                      uint64_t max_entries)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return fail(dc, VLMD_ERR_PROTO, "%s is not a map", what);
    const msgpack_object_map *m = &o->via.map;
    if (m->size > max_entries)
        return fail(dc, VLMD_ERR_TOO_LARGE, "%s: %u entries, more than %llu", what, m->size,
                    (unsigned long long)max_entries);
    for (uint32_t i = 0; i < m->size; i++) {
        if (m->ptr[i].key.type != MSGPACK_OBJECT_STR)
            return fail(dc, VLMD_ERR_PROTO, "%s: a key is not a string", what);
        for (uint32_t j = 0; j < i; j++)
            if (same_str(&m->ptr[i].key, &m->ptr[j].key))
                return fail(dc, VLMD_ERR_PROTO, "%s: duplicate key '%.*s'", what,
                            (int)m->ptr[i].key.via.str.size, m->ptr[i].key.via.str.ptr);
    }
    return true;
}

/* A heap copy of string o (NUL-terminated); NULL after fail() when o is not a
 * string, is over VLMD_PROTO_MAX_STR bytes or holds a NUL byte. */
static char *str_dup_checked(decoder *dc, const msgpack_object *o, const char *what)
{
    if (o->type != MSGPACK_OBJECT_STR) {
        fail(dc, VLMD_ERR_PROTO, "%s is not a string", what);
        return NULL;
    }
    uint32_t n = o->via.str.size;
    if (n > VLMD_PROTO_MAX_STR) {
        fail(dc, VLMD_ERR_PROTO, "%s: string of %u bytes, more than %u", what, n,
             VLMD_PROTO_MAX_STR);
        return NULL;
    }
    if (n && memchr(o->via.str.ptr, '\0', n)) {
        fail(dc, VLMD_ERR_PROTO, "%s holds a NUL byte", what);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        fail(dc, VLMD_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (n)
        memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    return s;
}

/* An unsigned integer <= max; fails (VLMD_ERR_PROTO) for any other type,
 * negative values included, and for values over max. */
static bool get_uint(decoder *dc, const msgpack_object *o, const char *key, uint64_t max,
                     uint64_t *out)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is not an unsigned integer", key);
    if (o->via.u64 > max)
        return fail(dc, VLMD_ERR_PROTO, "field '%s': %llu is over %llu", key,
                    (unsigned long long)o->via.u64, (unsigned long long)max);
    *out = o->via.u64;
    return true;
}

/* A signed integer in [min, max]; fails (VLMD_ERR_PROTO) otherwise. */
static bool get_int(decoder *dc, const msgpack_object *o, const char *key, int64_t min,
                    int64_t max, int64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)max)
            return fail(dc, VLMD_ERR_PROTO, "field '%s': %llu is over %lld", key,
                        (unsigned long long)o->via.u64, (long long)max);
        *out = (int64_t)o->via.u64;
        return true;
    }
    if (o->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is not an integer", key);
    if (o->via.i64 < min)
        return fail(dc, VLMD_ERR_PROTO, "field '%s': %lld is under %lld", key,
                    (long long)o->via.i64, (long long)min);
    *out = o->via.i64;
    return true;
}

/* A finite number: float32, float64 or an integer (another encoder may
 * write 1.0 as 1). */
static bool get_f64(decoder *dc, const msgpack_object *o, const char *key, double *out)
{
    double v;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
        v = o->via.f64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        v = (double)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        v = (double)o->via.i64;
    else
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is not a number", key);
    if (!isfinite(v))
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is not finite", key);
    *out = v;
    return true;
}

/* One element of a float array: float32 or float64 (NaN and infinities pass,
 * -inf is a fine log-probability); a finite float64 beyond float's range fails. */
static bool get_f32(decoder *dc, const msgpack_object *o, const char *key, float *out)
{
    if (o->type != MSGPACK_OBJECT_FLOAT32 && o->type != MSGPACK_OBJECT_FLOAT64)
        return fail(dc, VLMD_ERR_PROTO, "field '%s' holds a non-float", key);
    double v = o->via.f64;
    if (isfinite(v) && fabs(v) > FLT_MAX)
        return fail(dc, VLMD_ERR_PROTO, "field '%s' holds %g, beyond float", key, v);
    *out = (float)v;
    return true;
}

/* Checks an array field's type and length: its element count, or -1 after fail(). */
static int64_t array_len(decoder *dc, const field_desc *f, const msgpack_object *o)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        fail(dc, VLMD_ERR_PROTO, "field '%s' is not an array", f->key);
        return -1;
    }
    if (o->via.array.size > f->limit) {
        fail(dc, VLMD_ERR_TOO_LARGE, "field '%s': %u elements, more than %llu", f->key,
             o->via.array.size, (unsigned long long)f->limit);
        return -1;
    }
    return o->via.array.size;
}

/* Zeroed room for n elements of sz bytes, NULL for n == 0; false after fail(). */
static bool alloc_elems(decoder *dc, size_t n, size_t sz, void **out)
{
    *out = n ? calloc(n, sz) : NULL;
    return n == 0 || *out || fail(dc, VLMD_ERR_NOMEM, "out of memory");
}

static bool struct_decode(decoder *dc, const struct_desc *d, const msgpack_object *o, void *s);

static bool decode_bin(decoder *dc, const field_desc *f, const msgpack_object *o, void *s)
{
    if (o->type != MSGPACK_OBJECT_BIN)
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is not binary", f->key);
    if (o->via.bin.size > f->limit)
        return fail(dc, VLMD_ERR_TOO_LARGE, "field '%s': %u bytes, more than %llu", f->key,
                    o->via.bin.size, (unsigned long long)f->limit);
    void *p;
    if (!alloc_elems(dc, o->via.bin.size, 1, &p))
        return false;
    if (p)
        memcpy(p, o->via.bin.ptr, o->via.bin.size);
    *AT(s, f->offset, void *) = p;
    *AT(s, f->count_offset, uint32_t) = o->via.bin.size;
    return true;
}

static bool decode_num_array(decoder *dc, const field_desc *f, const msgpack_object *o, void *s)
{
    int64_t n = array_len(dc, f, o);
    void *p;
    if (n < 0 || !alloc_elems(dc, (size_t)n, 4, &p))
        return false;
    *AT(s, f->offset, void *) = p;
    *AT(s, f->count_offset, uint32_t) = (uint32_t)n;
    for (int64_t k = 0; k < n; k++) {
        const msgpack_object *e = &o->via.array.ptr[k];
        uint64_t u = 0;
        if (f->kind == F_F32_ARRAY) {
            if (!get_f32(dc, e, f->key, &((float *)p)[k]))
                return false;
        } else if (!get_uint(dc, e, f->key, UINT32_MAX, &u)) {
            return false;
        } else {
            ((uint32_t *)p)[k] = (uint32_t)u;
        }
    }
    return true;
}

static bool decode_kv(decoder *dc, const field_desc *f, const msgpack_object *o, void *s)
{
    char what[64];
    snprintf(what, sizeof what, "field '%s'", f->key);
    void *p;
    if (!map_check(dc, o, what, f->limit) ||
        !alloc_elems(dc, o->via.map.size, sizeof(vlmd_kv), &p))
        return false;
    vlmd_kv *kv = p;
    *AT(s, f->offset, vlmd_kv *) = kv;
    *AT(s, f->count_offset, uint32_t) = o->via.map.size;
    for (uint32_t k = 0; k < o->via.map.size; k++) {
        snprintf(what, sizeof what, "field '%s' entry %u", f->key, k);
        kv[k].key = str_dup_checked(dc, &o->via.map.ptr[k].key, what);
        kv[k].value = kv[k].key ? str_dup_checked(dc, &o->via.map.ptr[k].val, what) : NULL;
        if (!kv[k].value)
            return false;
    }
    return true;
}

static bool decode_struct_array(decoder *dc, const field_desc *f, const msgpack_object *o,
                                void *s)
{
    int64_t n = array_len(dc, f, o);
    void *p;
    if (n < 0 || !alloc_elems(dc, (size_t)n, f->sub->size, &p))
        return false;
    *AT(s, f->offset, void *) = p;
    *AT(s, f->count_offset, uint32_t) = (uint32_t)n;
    for (int64_t k = 0; k < n; k++) {
        size_t old = path_push(dc, f->key, k);
        char *elem = (char *)p + (size_t)k * f->sub->size;
        bool ok = struct_decode(dc, f->sub, &o->via.array.ptr[k], elem);
        path_pop(dc, old);
        if (!ok)
            return false;
    }
    return true;
}

/* Decodes value o of field f into struct s (zeroed, so that whatever was
 * allocated before a failure is freed by struct_free). */
static bool field_decode(decoder *dc, const field_desc *f, const msgpack_object *o, void *s)
{
    uint64_t u = 0;
    int64_t i = 0;
    switch (f->kind) {
    case F_U32:
        if (!get_uint(dc, o, f->key, f->limit, &u))
            return false;
        *AT(s, f->offset, uint32_t) = (uint32_t)u;
        return true;
    case F_U64:
        return get_uint(dc, o, f->key, UINT64_MAX, AT(s, f->offset, uint64_t));
    case F_I32:
        if (!get_int(dc, o, f->key, INT32_MIN, INT32_MAX, &i))
            return false;
        *AT(s, f->offset, int32_t) = (int32_t)i;
        return true;
    case F_I64:
        return get_int(dc, o, f->key, INT64_MIN, INT64_MAX, AT(s, f->offset, int64_t));
    case F_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not a boolean", f->key);
        *AT(s, f->offset, bool) = o->via.boolean;
        return true;
    case F_F64:
        return get_f64(dc, o, f->key, AT(s, f->offset, double));
    case F_STR: {
        char what[64];
        snprintf(what, sizeof what, "field '%s'", f->key);
        return (*AT(s, f->offset, char *) = str_dup_checked(dc, o, what)) != NULL;
    }
    case F_HASH:
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != 32)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not 32 bytes of binary", f->key);
        memcpy(AT(s, f->offset, uint8_t), o->via.bin.ptr, 32);
        return true;
    case F_BIN:
        return decode_bin(dc, f, o, s);
    case F_U32_ARRAY:
    case F_F32_ARRAY:
        return decode_num_array(dc, f, o, s);
    case F_KV:
        return decode_kv(dc, f, o, s);
    case F_STRUCT: {
        size_t old = path_push(dc, f->key, -1);
        bool ok = struct_decode(dc, f->sub, o, AT(s, f->offset, char));
        path_pop(dc, old);
        return ok;
    }
    case F_STRUCT_ARRAY:
        return decode_struct_array(dc, f, o, s);
    }
    return fail(dc, VLMD_ERR_INTERNAL, "field '%s': unknown field kind", f->key);
}

/* The value of key in map o (checked by map_check), or NULL. */
static const msgpack_object *map_get(const msgpack_object *o, const char *key)
{
    for (uint32_t k = 0; k < o->via.map.size; k++)
        if (key_is(&o->via.map.ptr[k].key, key))
            return &o->via.map.ptr[k].val;
    return NULL;
}

/* Fills zeroed struct s from map o: every known field, absent optional ones
 * at their default ("" for strings), unknown keys ignored. */
static bool struct_decode(decoder *dc, const struct_desc *d, const msgpack_object *o, void *s)
{
    if (!map_check(dc, o, d->name ? d->name : "the body", PROTO_MAX_BODY_KEYS))
        return false;
    for (size_t i = 0; i < d->n_fields; i++) {
        const field_desc *f = &d->fields[i];
        const msgpack_object *val = map_get(o, f->key);
        if (val) {
            if (!field_decode(dc, f, val, s))
                return false;
        } else if (!f->optional) {
            return fail(dc, VLMD_ERR_PROTO, "missing field '%s'", f->key);
        } else if (f->kind == F_STR && !(*AT(s, f->offset, char *) = calloc(1, 1))) {
            return fail(dc, VLMD_ERR_NOMEM, "out of memory");
        }
    }
    return true;
}

/* Checks [version, type, body] and decodes body into out; out->type is set
 * before the body is decoded so that vlmd_msg_free() can clean up. */
static bool root_decode(decoder *dc, const msgpack_object *root, vlmd_msg *out)
{
    uint64_t version = 0, type = 0;
    if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size != 3)
        return fail(dc, VLMD_ERR_PROTO, "not an array of [version, type, body]");
    const msgpack_object *v = root->via.array.ptr;
    if (!get_uint(dc, &v[0], "version", UINT64_MAX, &version) ||
        !get_uint(dc, &v[1], "type", UINT64_MAX, &type))
        return false;
    if (version != VLMD_PROTO_VERSION)
        return fail(dc, VLMD_ERR_VERSION, "version %llu, this build speaks %d",
                    (unsigned long long)version, VLMD_PROTO_VERSION);
    if (!msg_type_known(type))
        return fail(dc, VLMD_ERR_PROTO, "unknown message type %llu", (unsigned long long)type);
    out->type = (vlmd_msg_type)type;
    snprintf(dc->path, sizeof dc->path, "%s", msg_type_names[type]);
    if (!struct_decode(dc, &body_descs[type], &v[2], &out->u))
        return false;
    char why[200];
    if (out->type == VLMD_MSG_TOKEN_CHUNK &&
        !token_chunk_shapes_ok(&out->u.token_chunk, why, sizeof why))
        return fail(dc, VLMD_ERR_PROTO, "%s", why);
    return true;
}

vlmd_status vlmd_msg_decode(const void *data, size_t len, vlmd_msg *out, vlmd_error *err)
{
    if (!out)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "decode: NULL output");
    memset(out, 0, sizeof *out);
    decoder dc = {.err = err, .st = VLMD_OK, .path = "message"};
    if (!data && len)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "decode: NULL data of %zu bytes", len);
    if (len > VLMD_PROTO_MAX_MSG_BYTES) {
        fail(&dc, VLMD_ERR_TOO_LARGE, "%zu bytes, more than %u", len, VLMD_PROTO_MAX_MSG_BYTES);
        return dc.st;
    }
    if (!prescan(&dc, data, len))
        return dc.st;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&up, data, len, &off);
    if (rc != MSGPACK_UNPACK_SUCCESS || off != len)
        fail(&dc, rc == MSGPACK_UNPACK_NOMEM_ERROR ? VLMD_ERR_NOMEM : VLMD_ERR_PROTO,
             "msgpack-c could not unpack what the prescan passed (%d)", (int)rc);
    else
        root_decode(&dc, &up.data, out);
    msgpack_unpacked_destroy(&up);
    if (dc.st != VLMD_OK)
        vlmd_msg_free(out);
    return dc.st;
}
