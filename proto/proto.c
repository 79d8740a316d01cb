/* proto.c - msgpack encode/decode of every vlmd message (see proto.h).
 *
 * Table-driven: each message body and nested struct is described once by a
 * list of fields (key, kind, offset, limit); one walker encodes, one decodes,
 * one frees. A decode runs in three steps, each rejecting before trusting:
 *   1. prescan: walk the raw bytes; every declared length and element count
 *      must fit in what is left (msgpack-c would otherwise allocate for a
 *      declared count before seeing the data), depth <= PROTO_MAX_DEPTH, no
 *      ext types, no trailing bytes;
 *   2. msgpack-c unpacks into an object tree;
 *   3. the tree is checked field by field against the table: types, ranges,
 *      enum values, lengths, duplicate keys; unknown keys are ignored.
 * Any failure frees what was built and leaves the message zeroed.
 *
 * Optional fields (absent means the default shown; everything else is
 * required):  message (""), device (""), listen_url (""), logprobs (none),
 * kv_used_tokens (0), top_n (0), top_ids and top_logprobs (none). Fields added after the first release are optional, so
 * an older sender stays understood. */
#include "proto.h"

#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#define PROTO_MAX_DEPTH 16
#define PROTO_MAX_BODY_KEYS 64

/* ---- names -------------------------------------------------------------- */

static const char *const msg_type_names[] = {
    [VLMD_MSG_HELLO] = "hello",
    [VLMD_MSG_WELCOME] = "welcome",
    [VLMD_MSG_READY] = "ready",
    [VLMD_MSG_HEARTBEAT] = "heartbeat",
    [VLMD_MSG_FOOTPRINT_REQUEST] = "footprint_request",
    [VLMD_MSG_FOOTPRINT_REPLY] = "footprint_reply",
    [VLMD_MSG_WORKER_EXIT] = "worker_exit",
    [VLMD_MSG_STATS_SNAPSHOT] = "stats_snapshot",
    [VLMD_MSG_SHUTDOWN] = "shutdown",
    [VLMD_MSG_REQUEST_SUBMIT] = "request_submit",
    [VLMD_MSG_REQUEST_CANCEL] = "request_cancel",
    [VLMD_MSG_TOKEN_CHUNK] = "token_chunk",
    [VLMD_MSG_IMAGE_JOB] = "image_job",
    [VLMD_MSG_IMAGE_RESULT] = "image_result",
};

const char *vlmd_msg_type_str(vlmd_msg_type t)
{
    if (t < 1 || t > VLMD_MSG_TYPE_MAX)
        return "unknown";
    return msg_type_names[t];
}

const char *vlmd_worker_state_str(vlmd_worker_state s)
{
    static const char *const names[] = {"down", "starting", "ready"};
    return (unsigned)s < VLMD_WORKER_STATE_COUNT ? names[s] : "unknown";
}

const char *vlmd_finish_reason_str(vlmd_finish_reason r)
{
    static const char *const names[] = {"none", "stop", "length", "cancelled", "error"};
    return (unsigned)r < VLMD_FINISH_COUNT ? names[r] : "unknown";
}

/* ---- the tables ---------------------------------------------------------- */

typedef enum field_kind {
    F_U32,          /* uint32_t <= limit */
    F_U64,          /* uint64_t */
    F_I32,          /* int32_t */
    F_I64,          /* int64_t */
    F_BOOL,
    F_F64,          /* finite double */
    F_STR,          /* char *, owned, no NUL, at most VLMD_PROTO_MAX_STR bytes */
    F_HASH,         /* uint8_t[32] */
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
    size_t count_offset;    /* of the uint32_t count, for arrays */
    uint64_t limit;         /* max value (F_U32) or max count (arrays) */
    const struct_desc *sub; /* F_STRUCT, F_STRUCT_ARRAY */
} field_desc;

struct struct_desc {
    const char *name;
    size_t size;
    const field_desc *fields;
    size_t n_fields;
};

#define FLD(T, f, kind) {#f, kind, false, offsetof(T, f), 0, 0, NULL}
#define ENUM(T, f, count) {#f, F_U32, false, offsetof(T, f), 0, (count) - 1, NULL}
#define OPT(T, f, kind) {#f, kind, true, offsetof(T, f), 0, 0, NULL}
#define ARR(T, f, n, kind, lim) {#f, kind, false, offsetof(T, f), offsetof(T, n), (lim), NULL}
#define OPT_ARR(T, f, n, kind, lim) {#f, kind, true, offsetof(T, f), offsetof(T, n), (lim), NULL}
#define SUB(T, f, d) {#f, F_STRUCT, false, offsetof(T, f), 0, 0, &(d)}
#define SUB_ARR(T, f, n, d, lim) {#f, F_STRUCT_ARRAY, false, offsetof(T, f), offsetof(T, n), (lim), &(d)}
#define DESC(T, name, fields) {name, sizeof(T), fields, sizeof fields / sizeof fields[0]}
#define U32(T, f) {#f, F_U32, false, offsetof(T, f), 0, UINT32_MAX, NULL}

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
};
static const field_desc heartbeat_fields[] = {
    ENUM(vlmd_msg_heartbeat, role, VLMD_ROLE_COUNT),
    U32(vlmd_msg_heartbeat, rank),
    FLD(vlmd_msg_heartbeat, pid, F_I64),
    ENUM(vlmd_msg_heartbeat, state, VLMD_WORKER_STATE_COUNT),
    FLD(vlmd_msg_heartbeat, seq, F_U64),
    OPT(vlmd_msg_heartbeat, kv_used_tokens, F_U64),
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
};
static const struct_desc worker_info_desc = DESC(vlmd_worker_info, "worker", worker_info_fields);
static const field_desc stats_snapshot_fields[] = {
    FLD(vlmd_msg_stats_snapshot, seq, F_U64),
    FLD(vlmd_msg_stats_snapshot, dropped_messages, F_U64),
    SUB_ARR(vlmd_msg_stats_snapshot, workers, n_workers, worker_info_desc, VLMD_PROTO_MAX_WORKERS),
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
};
static const struct_desc image_ref_desc = DESC(vlmd_image_ref, "image", image_ref_fields);
static const field_desc request_submit_fields[] = {
    FLD(vlmd_msg_request_submit, req_id, F_U64),
    ARR(vlmd_msg_request_submit, tokens, n_tokens, F_U32_ARRAY, VLMD_PROTO_MAX_TOKENS),
    U32(vlmd_msg_request_submit, max_tokens),
    SUB(vlmd_msg_request_submit, sampling, sampling_desc),
    ARR(vlmd_msg_request_submit, stop_tokens, n_stop_tokens, F_U32_ARRAY, VLMD_PROTO_MAX_STOPS),
    {"top_logprobs", F_U32, false, offsetof(vlmd_msg_request_submit, top_logprobs), 0, 20, NULL},
    FLD(vlmd_msg_request_submit, logprobs, F_BOOL),
    SUB_ARR(vlmd_msg_request_submit, images, n_images, image_ref_desc, VLMD_PROTO_MAX_IMAGES),
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
    U32(vlmd_msg_token_chunk, cached_tokens),
    {"top_n", F_U32, true, offsetof(vlmd_msg_token_chunk, top_n), 0, 20, NULL},
    OPT_ARR(vlmd_msg_token_chunk, top_ids, n_top_ids, F_U32_ARRAY, VLMD_PROTO_MAX_TOKENS),
    OPT_ARR(vlmd_msg_token_chunk, top_logprobs, n_top_logprobs, F_F32_ARRAY,
            VLMD_PROTO_MAX_TOKENS),
};
static const field_desc image_job_fields[] = {
    FLD(vlmd_msg_image_job, req_id, F_U64),
    U32(vlmd_msg_image_job, image_index),
    FLD(vlmd_msg_image_job, hash, F_HASH),
    ARR(vlmd_msg_image_job, data, n_data, F_BIN, VLMD_PROTO_MAX_IMAGE_BYTES),
    U32(vlmd_msg_image_job, width),
    U32(vlmd_msg_image_job, height),
};
static const field_desc image_result_fields[] = {
    FLD(vlmd_msg_image_result, req_id, F_U64),
    U32(vlmd_msg_image_result, image_index),
    ENUM(vlmd_msg_image_result, status, VLMD_STATUS_COUNT),
    OPT(vlmd_msg_image_result, message, F_STR),
    SUB(vlmd_msg_image_result, image, image_ref_desc),
    FLD(vlmd_msg_image_result, embed_bytes, F_U64),
};

static const struct_desc body_descs[VLMD_MSG_TYPE_MAX + 1] = {
    [VLMD_MSG_HELLO] = DESC(vlmd_msg_hello, "hello", hello_fields),
    [VLMD_MSG_WELCOME] = DESC(vlmd_msg_welcome, "welcome", welcome_fields),
    [VLMD_MSG_READY] = DESC(vlmd_msg_ready, "ready", ready_fields),
    [VLMD_MSG_HEARTBEAT] = DESC(vlmd_msg_heartbeat, "heartbeat", heartbeat_fields),
    [VLMD_MSG_FOOTPRINT_REQUEST] =
        DESC(vlmd_msg_footprint_request, "footprint_request", footprint_request_fields),
    [VLMD_MSG_FOOTPRINT_REPLY] =
        DESC(vlmd_msg_footprint_reply, "footprint_reply", footprint_reply_fields),
    [VLMD_MSG_WORKER_EXIT] = DESC(vlmd_msg_worker_exit, "worker_exit", worker_exit_fields),
    [VLMD_MSG_STATS_SNAPSHOT] =
        DESC(vlmd_msg_stats_snapshot, "stats_snapshot", stats_snapshot_fields),
    [VLMD_MSG_SHUTDOWN] = DESC(vlmd_msg_shutdown, "shutdown", shutdown_fields),
    [VLMD_MSG_REQUEST_SUBMIT] =
        DESC(vlmd_msg_request_submit, "request_submit", request_submit_fields),
    [VLMD_MSG_REQUEST_CANCEL] =
        DESC(vlmd_msg_request_cancel, "request_cancel", request_cancel_fields),
    [VLMD_MSG_TOKEN_CHUNK] = DESC(vlmd_msg_token_chunk, "token_chunk", token_chunk_fields),
    [VLMD_MSG_IMAGE_JOB] = DESC(vlmd_msg_image_job, "image_job", image_job_fields),
    [VLMD_MSG_IMAGE_RESULT] = DESC(vlmd_msg_image_result, "image_result", image_result_fields),
};

#define AT(base, off, T) ((T *)((char *)(base) + (off)))

/* ---- freeing ------------------------------------------------------------- */

static void free_kv(vlmd_kv *kv, uint32_t n)
{
    for (uint32_t i = 0; kv && i < n; i++) {
        free(kv[i].key);
        free(kv[i].value);
    }
    free(kv);
}

static void struct_free(const struct_desc *d, void *s)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const field_desc *f = &d->fields[i];
        uint32_t n = f->count_offset ? *AT(s, f->count_offset, uint32_t) : 0;
        switch (f->kind) {
        case F_STR:
        case F_BIN:
        case F_U32_ARRAY:
        case F_F32_ARRAY:
            free(*AT(s, f->offset, void *));
            break;
        case F_KV:
            free_kv(*AT(s, f->offset, vlmd_kv *), n);
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
    if (msg->type >= 1 && msg->type <= VLMD_MSG_TYPE_MAX)
        struct_free(&body_descs[msg->type], &msg->u);
    memset(msg, 0, sizeof *msg);
}

/* ---- encoding ------------------------------------------------------------ */

static int buf_write(void *data, const char *bytes, size_t len)
{
    return vlmd_buf_append(data, bytes, len) == VLMD_OK ? 0 : -1;
}

static vlmd_status struct_encode(const struct_desc *d, const void *s, msgpack_packer *pk,
                                 vlmd_error *err);

static vlmd_status field_encode(const struct_desc *d, const field_desc *f, const void *s,
                                msgpack_packer *pk, vlmd_error *err)
{
    uint32_t n = f->count_offset ? *AT(s, f->count_offset, uint32_t) : 0;
    bool is_pointer = f->kind == F_STR || f->kind == F_BIN || f->kind == F_U32_ARRAY ||
                      f->kind == F_F32_ARRAY || f->kind == F_KV || f->kind == F_STRUCT_ARRAY;
    const void *ptr = is_pointer ? *AT(s, f->offset, const void *) : NULL;
    if (f->count_offset && n > f->limit)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s.%s: %u elements, more than %llu", d->name,
                           f->key, n, (unsigned long long)f->limit);
    if (f->count_offset && n && !ptr)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: NULL with %u elements", d->name,
                           f->key, n);
    switch (f->kind) {
    case F_U32: {
        uint32_t v = *AT(s, f->offset, uint32_t);
        if (v > f->limit)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s: %u is over %llu", d->name,
                               f->key, v, (unsigned long long)f->limit);
        return msgpack_pack_uint32(pk, v) ? VLMD_ERR_NOMEM : VLMD_OK;
    }
    case F_U64:
        return msgpack_pack_uint64(pk, *AT(s, f->offset, uint64_t)) ? VLMD_ERR_NOMEM : VLMD_OK;
    case F_I32:
        return msgpack_pack_int32(pk, *AT(s, f->offset, int32_t)) ? VLMD_ERR_NOMEM : VLMD_OK;
    case F_I64:
        return msgpack_pack_int64(pk, *AT(s, f->offset, int64_t)) ? VLMD_ERR_NOMEM : VLMD_OK;
    case F_BOOL:
        return (*AT(s, f->offset, bool) ? msgpack_pack_true(pk) : msgpack_pack_false(pk))
                   ? VLMD_ERR_NOMEM : VLMD_OK;
    case F_F64: {
        double v = *AT(s, f->offset, double);
        if (!isfinite(v))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s.%s is not finite", d->name, f->key);
        return msgpack_pack_double(pk, v) ? VLMD_ERR_NOMEM : VLMD_OK;
    }
    case F_STR: {
        const char *str = ptr ? ptr : "";
        size_t len = strlen(str);
        if (len > VLMD_PROTO_MAX_STR)
            return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s.%s: string of %zu bytes", d->name,
                               f->key, len);
        return msgpack_pack_str_with_body(pk, str, len) ? VLMD_ERR_NOMEM : VLMD_OK;
    }
    case F_HASH:
        return msgpack_pack_bin_with_body(pk, AT(s, f->offset, uint8_t), 32) ? VLMD_ERR_NOMEM
                                                                             : VLMD_OK;
    case F_BIN:
        return msgpack_pack_bin_with_body(pk, ptr, n) ? VLMD_ERR_NOMEM : VLMD_OK;
    case F_U32_ARRAY: {
        if (msgpack_pack_array(pk, n))
            return VLMD_ERR_NOMEM;
        for (uint32_t k = 0; k < n; k++)
            if (msgpack_pack_uint32(pk, ((const uint32_t *)ptr)[k]))
                return VLMD_ERR_NOMEM;
        return VLMD_OK;
    }
    case F_F32_ARRAY: {
        if (msgpack_pack_array(pk, n))
            return VLMD_ERR_NOMEM;
        for (uint32_t k = 0; k < n; k++)
            if (msgpack_pack_float(pk, ((const float *)ptr)[k]))
                return VLMD_ERR_NOMEM;
        return VLMD_OK;
    }
    case F_KV: {
        const vlmd_kv *kv = ptr;
        if (msgpack_pack_map(pk, n))
            return VLMD_ERR_NOMEM;
        for (uint32_t k = 0; k < n; k++) {
            size_t kl = kv[k].key ? strlen(kv[k].key) : 0, vl = kv[k].value ? strlen(kv[k].value) : 0;
            if (kl > VLMD_PROTO_MAX_STR || vl > VLMD_PROTO_MAX_STR)
                return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s.%s: entry %u too long", d->name,
                                   f->key, k);
            if (msgpack_pack_str_with_body(pk, kv[k].key ? kv[k].key : "", kl) ||
                msgpack_pack_str_with_body(pk, kv[k].value ? kv[k].value : "", vl))
                return VLMD_ERR_NOMEM;
        }
        return VLMD_OK;
    }
    case F_STRUCT:
        return struct_encode(f->sub, AT(s, f->offset, char), pk, err);
    case F_STRUCT_ARRAY: {
        if (msgpack_pack_array(pk, n))
            return VLMD_ERR_NOMEM;
        for (uint32_t k = 0; k < n; k++) {
            vlmd_status st = struct_encode(f->sub, (const char *)ptr + (size_t)k * f->sub->size,
                                           pk, err);
            if (st != VLMD_OK)
                return st;
        }
        return VLMD_OK;
    }
    }
    return VLMD_ERR_INTERNAL;
}

static vlmd_status struct_encode(const struct_desc *d, const void *s, msgpack_packer *pk,
                                 vlmd_error *err)
{
    if (msgpack_pack_map(pk, (size_t)d->n_fields))
        return VLMD_ERR_NOMEM;
    for (size_t i = 0; i < d->n_fields; i++) {
        const field_desc *f = &d->fields[i];
        if (msgpack_pack_str_with_body(pk, f->key, strlen(f->key)))
            return VLMD_ERR_NOMEM;
        vlmd_status st = field_encode(d, f, s, pk, err);
        if (st != VLMD_OK)
            return st == VLMD_ERR_NOMEM && (!err || err->status != VLMD_ERR_NOMEM)
                       ? vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory encoding %s", d->name)
                       : st;
    }
    return VLMD_OK;
}

/* logprobs: none or one per token; alternatives: tokens x top_n, ids and values alike. */
static bool token_chunk_shapes_ok(const vlmd_msg_token_chunk *c)
{
    uint64_t alts = (uint64_t)c->n_tokens * c->top_n;
    return (c->n_logprobs == 0 || c->n_logprobs == c->n_tokens) && c->n_top_ids == alts &&
           c->n_top_logprobs == alts;
}

vlmd_status vlmd_msg_encode(const vlmd_msg *msg, vlmd_buf *out, vlmd_error *err)
{
    if (msg->type < 1 || msg->type > VLMD_MSG_TYPE_MAX)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "unknown message type %d", (int)msg->type);
    if (msg->type == VLMD_MSG_TOKEN_CHUNK && !token_chunk_shapes_ok(&msg->u.token_chunk))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "token_chunk: logprob arrays do not match "
                           "%u tokens x %u alternatives", msg->u.token_chunk.n_tokens,
                           msg->u.token_chunk.top_n);
    size_t start = out->len;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    vlmd_status st = VLMD_OK;
    if (msgpack_pack_array(&pk, 3) || msgpack_pack_uint32(&pk, VLMD_PROTO_VERSION) ||
        msgpack_pack_uint32(&pk, msg->type))
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory encoding a message");
    else
        st = struct_encode(&body_descs[msg->type], &msg->u, &pk, err);
    if (st == VLMD_OK && out->len - start > VLMD_PROTO_MAX_MSG_BYTES)
        st = vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s message of %zu bytes",
                         vlmd_msg_type_str(msg->type), out->len - start);
    if (st != VLMD_OK) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return st;
}

/* ---- step 1: prescan of the raw bytes ------------------------------------ */

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Walks one msgpack object tree at the start of data; returns its length in
 * bytes, or 0 when a declared size does not fit, nesting is too deep, or an
 * ext or reserved type appears. */
static size_t prescan(const uint8_t *data, size_t len)
{
    uint64_t pending[PROTO_MAX_DEPTH + 1]; /* objects still to read at each depth */
    int depth = 0;
    pending[0] = 1;
    size_t pos = 0;
    while (depth >= 0) {
        if (pending[depth] == 0) {
            depth--;
            continue;
        }
        pending[depth]--;
        if (pos >= len)
            return 0;
        uint8_t b = data[pos++];
        uint64_t skip = 0, items = 0;
        int lenbytes = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b >= 0x80 && b <= 0x8f) {
            items = 2u * (b & 0x0f);
        } else if (b >= 0x90 && b <= 0x9f) {
            items = b & 0x0f;
        } else if (b >= 0xa0 && b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4: case 0xd9: lenbytes = 1; break;      /* bin8, str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;      /* bin16, str16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;      /* bin32, str32 */
            case 0xca: skip = 4; break;                     /* float32 */
            case 0xcb: skip = 8; break;                     /* float64 */
            case 0xcc: case 0xd0: skip = 1; break;          /* (u)int8 */
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xdc: case 0xde: lenbytes = 2; break;      /* array16, map16 */
            case 0xdd: case 0xdf: lenbytes = 4; break;      /* array32, map32 */
            default: return 0;                              /* ext types, 0xc1 */
            }
        }
        if (lenbytes) {
            if (len - pos < (size_t)lenbytes)
                return 0;
            uint64_t n = be(data + pos, lenbytes);
            pos += (size_t)lenbytes;
            if (b == 0xdc || b == 0xdd)
                items = n;
            else if (b == 0xde || b == 0xdf)
                items = 2 * n;
            else
                skip = n;
        }
        if (skip > len - pos)
            return 0;
        pos += (size_t)skip;
        if (items) {
            /* every element takes at least one byte */
            if (items > len - pos || depth == PROTO_MAX_DEPTH)
                return 0;
            pending[++depth] = items;
        }
    }
    return pos;
}

/* ---- step 3: checking the object tree against the tables ----------------- */

typedef struct decoder {
    vlmd_error *err;
    vlmd_status st;
    const char *where;  /* struct name, for messages */
} decoder;

static bool fail(decoder *dc, vlmd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
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
        vlmd_errorf(dc->err, st, "%s: %s", dc->where, msg);
    }
    return false;
}

static bool key_is(const msgpack_object *k, const char *key)
{
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, key, n) == 0;
}

static bool same_str(const msgpack_object *a, const msgpack_object *b)
{
    return a->via.str.size == b->via.str.size &&
           memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0;
}

/* Keys must be strings, without duplicates. */
static bool check_keys(decoder *dc, const msgpack_object_map *m, uint32_t max_keys)
{
    if (m->size > max_keys)
        return fail(dc, VLMD_ERR_TOO_LARGE, "map of %u entries, more than %u", m->size, max_keys);
    for (uint32_t i = 0; i < m->size; i++) {
        if (m->ptr[i].key.type != MSGPACK_OBJECT_STR)
            return fail(dc, VLMD_ERR_PROTO, "a map key is not a string");
        for (uint32_t j = 0; j < i; j++)
            if (same_str(&m->ptr[i].key, &m->ptr[j].key))
                return fail(dc, VLMD_ERR_PROTO, "duplicate key '%.*s'",
                            (int)m->ptr[i].key.via.str.size, m->ptr[i].key.via.str.ptr);
    }
    return true;
}

static char *dup_str(decoder *dc, const msgpack_object *o, const char *key)
{
    if (o->type != MSGPACK_OBJECT_STR) {
        fail(dc, VLMD_ERR_PROTO, "field '%s' is not a string", key);
        return NULL;
    }
    uint32_t n = o->via.str.size;
    if (n > VLMD_PROTO_MAX_STR) {
        fail(dc, VLMD_ERR_TOO_LARGE, "field '%s': string of %u bytes, more than %u", key, n,
             VLMD_PROTO_MAX_STR);
        return NULL;
    }
    if (memchr(o->via.str.ptr, '\0', n)) {
        fail(dc, VLMD_ERR_PROTO, "field '%s' holds a NUL byte", key);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        fail(dc, VLMD_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    return s;
}

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

static bool get_int(decoder *dc, const msgpack_object *o, const char *key, int64_t min,
                    int64_t max, int64_t *out)
{
    int64_t v;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)max)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is out of range", key);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is not an integer", key);
    }
    if (v < min || v > max)
        return fail(dc, VLMD_ERR_PROTO, "field '%s' is out of range", key);
    *out = v;
    return true;
}

static bool struct_decode(decoder *dc, const struct_desc *d, const msgpack_object *o, void *s);

/* Checks an array field's type and length; returns its element count or -1. */
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

/* Allocates n elements of size sz (NULL for n == 0, which is not a failure). */
static void *alloc_elems(decoder *dc, size_t n, size_t sz, bool *ok)
{
    *ok = true;
    if (!n)
        return NULL;
    void *p = calloc(n, sz);
    if (!p)
        *ok = fail(dc, VLMD_ERR_NOMEM, "out of memory");
    return p;
}

static bool field_decode(decoder *dc, const field_desc *f, const msgpack_object *o, void *s)
{
    uint64_t u = 0;
    int64_t i = 0;
    bool ok;
    switch (f->kind) {
    case F_U32:
        if (!get_uint(dc, o, f->key, f->limit, &u))
            return false;
        *AT(s, f->offset, uint32_t) = (uint32_t)u;
        return true;
    case F_U64:
        if (!get_uint(dc, o, f->key, UINT64_MAX, &u))
            return false;
        *AT(s, f->offset, uint64_t) = u;
        return true;
    case F_I32:
        if (!get_int(dc, o, f->key, INT32_MIN, INT32_MAX, &i))
            return false;
        *AT(s, f->offset, int32_t) = (int32_t)i;
        return true;
    case F_I64:
        if (!get_int(dc, o, f->key, INT64_MIN, INT64_MAX, &i))
            return false;
        *AT(s, f->offset, int64_t) = i;
        return true;
    case F_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not a boolean", f->key);
        *AT(s, f->offset, bool) = o->via.boolean;
        return true;
    case F_F64: {
        double v;
        if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
            v = o->via.f64;
        else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            v = (double)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            v = (double)o->via.i64;
        else
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not a number", f->key);
        if (!isfinite(v))
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not finite", f->key);
        *AT(s, f->offset, double) = v;
        return true;
    }
    case F_STR: {
        char *str = dup_str(dc, o, f->key);
        *AT(s, f->offset, char *) = str;
        return str != NULL;
    }
    case F_HASH:
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != 32)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not 32 bytes of binary", f->key);
        memcpy(AT(s, f->offset, uint8_t), o->via.bin.ptr, 32);
        return true;
    case F_BIN: {
        if (o->type != MSGPACK_OBJECT_BIN)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not binary", f->key);
        if (o->via.bin.size > f->limit)
            return fail(dc, VLMD_ERR_TOO_LARGE, "field '%s': %u bytes, more than %llu", f->key,
                        o->via.bin.size, (unsigned long long)f->limit);
        uint8_t *p = alloc_elems(dc, o->via.bin.size, 1, &ok);
        if (!ok)
            return false;
        if (p)
            memcpy(p, o->via.bin.ptr, o->via.bin.size);
        *AT(s, f->offset, uint8_t *) = p;
        *AT(s, f->count_offset, uint32_t) = o->via.bin.size;
        return true;
    }
    case F_U32_ARRAY:
    case F_F32_ARRAY: {
        int64_t n = array_len(dc, f, o);
        if (n < 0)
            return false;
        void *p = alloc_elems(dc, (size_t)n, 4, &ok);
        if (!ok)
            return false;
        *AT(s, f->offset, void *) = p;
        *AT(s, f->count_offset, uint32_t) = (uint32_t)n;
        for (int64_t k = 0; k < n; k++) {
            const msgpack_object *e = &o->via.array.ptr[k];
            if (f->kind == F_U32_ARRAY) {
                if (!get_uint(dc, e, f->key, UINT32_MAX, &u))
                    return false;
                ((uint32_t *)p)[k] = (uint32_t)u;
            } else {
                if (e->type != MSGPACK_OBJECT_FLOAT32 && e->type != MSGPACK_OBJECT_FLOAT64)
                    return fail(dc, VLMD_ERR_PROTO, "field '%s' holds a non-float", f->key);
                ((float *)p)[k] = (float)e->via.f64;
            }
        }
        return true;
    }
    case F_KV: {
        if (o->type != MSGPACK_OBJECT_MAP)
            return fail(dc, VLMD_ERR_PROTO, "field '%s' is not a map", f->key);
        const msgpack_object_map *m = &o->via.map;
        if (!check_keys(dc, m, (uint32_t)f->limit))
            return false;
        vlmd_kv *kv = alloc_elems(dc, m->size, sizeof *kv, &ok);
        if (!ok)
            return false;
        *AT(s, f->offset, vlmd_kv *) = kv;
        *AT(s, f->count_offset, uint32_t) = m->size;
        for (uint32_t k = 0; k < m->size; k++) {
            kv[k].key = dup_str(dc, &m->ptr[k].key, f->key);
            kv[k].value = kv[k].key ? dup_str(dc, &m->ptr[k].val, f->key) : NULL;
            if (!kv[k].value)
                return false;
        }
        return true;
    }
    case F_STRUCT:
        return struct_decode(dc, f->sub, o, AT(s, f->offset, char));
    case F_STRUCT_ARRAY: {
        int64_t n = array_len(dc, f, o);
        if (n < 0)
            return false;
        char *p = alloc_elems(dc, (size_t)n, f->sub->size, &ok);
        if (!ok)
            return false;
        *AT(s, f->offset, char *) = p;
        *AT(s, f->count_offset, uint32_t) = (uint32_t)n;
        for (int64_t k = 0; k < n; k++)
            if (!struct_decode(dc, f->sub, &o->via.array.ptr[k], p + (size_t)k * f->sub->size))
                return false;
        return true;
    }
    }
    return fail(dc, VLMD_ERR_INTERNAL, "unknown field kind");
}

/* Fills s from a map; s must be zeroed (so that a failure can be freed). */
static bool struct_decode(decoder *dc, const struct_desc *d, const msgpack_object *o, void *s)
{
    const char *outer = dc->where;
    dc->where = d->name;
    bool ok = true;
    if (o->type != MSGPACK_OBJECT_MAP)
        ok = fail(dc, VLMD_ERR_PROTO, "body is not a map");
    else
        ok = check_keys(dc, &o->via.map, PROTO_MAX_BODY_KEYS);
    for (size_t i = 0; ok && i < d->n_fields; i++) {
        const field_desc *f = &d->fields[i];
        const msgpack_object *val = NULL;
        for (uint32_t k = 0; k < o->via.map.size; k++)
            if (key_is(&o->via.map.ptr[k].key, f->key))
                val = &o->via.map.ptr[k].val;
        if (!val) {
            if (!f->optional)
                ok = fail(dc, VLMD_ERR_PROTO, "missing field '%s'", f->key);
            else if (f->kind == F_STR && !(*AT(s, f->offset, char *) = calloc(1, 1)))
                ok = fail(dc, VLMD_ERR_NOMEM, "out of memory");
            continue;
        }
        ok = field_decode(dc, f, val, s);
    }
    if (ok)
        dc->where = outer;
    return ok;
}

vlmd_status vlmd_msg_decode(const void *data, size_t len, vlmd_msg *out, vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    decoder dc = {.err = err, .where = "message"};
    if (len > VLMD_PROTO_MAX_MSG_BYTES) {
        fail(&dc, VLMD_ERR_TOO_LARGE, "%zu bytes, more than %u", len, VLMD_PROTO_MAX_MSG_BYTES);
        return dc.st;
    }
    size_t used = prescan(data, len);
    if (used == 0 || used != len) {
        if (used)
            fail(&dc, VLMD_ERR_PROTO, "%zu trailing bytes", len - used);
        else
            fail(&dc, VLMD_ERR_PROTO, "not well-formed msgpack (a size or count runs past the end, "
                 "nesting deeper than %d, or an ext type)", PROTO_MAX_DEPTH);
        return dc.st;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&up, data, len, &off);
    const msgpack_object *root = &up.data;
    uint64_t version = 0, type = 0;
    if (rc != MSGPACK_UNPACK_SUCCESS || off != len) {
        fail(&dc, rc == MSGPACK_UNPACK_NOMEM_ERROR ? VLMD_ERR_NOMEM : VLMD_ERR_PROTO,
             "msgpack unpack failed (%d)", (int)rc);
    } else if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size != 3) {
        fail(&dc, VLMD_ERR_PROTO, "not an array of [version, type, body]");
    } else if (!get_uint(&dc, &root->via.array.ptr[0], "version", UINT32_MAX, &version) ||
               !get_uint(&dc, &root->via.array.ptr[1], "type", UINT32_MAX, &type)) {
        /* fail() said why */
    } else if (version != VLMD_PROTO_VERSION) {
        fail(&dc, VLMD_ERR_VERSION, "version %llu, this build speaks %d",
             (unsigned long long)version, VLMD_PROTO_VERSION);
    } else if (type < 1 || type > VLMD_MSG_TYPE_MAX) {
        fail(&dc, VLMD_ERR_PROTO, "unknown message type %llu", (unsigned long long)type);
    } else {
        out->type = (vlmd_msg_type)type;
        if (struct_decode(&dc, &body_descs[type], &root->via.array.ptr[2], &out->u) &&
            out->type == VLMD_MSG_TOKEN_CHUNK && !token_chunk_shapes_ok(&out->u.token_chunk))
            fail(&dc, VLMD_ERR_PROTO, "logprob arrays do not match %u tokens x %u alternatives",
                 out->u.token_chunk.n_tokens, out->u.token_chunk.top_n);
    }
    msgpack_unpacked_destroy(&up);
    if (dc.st != VLMD_OK)
        vlmd_msg_free(out);
    return dc.st;
}
