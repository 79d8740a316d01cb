/* backend.c - opens the backend --device picks (with the CUDA backend's
 * options) and counts every allocation. */
#include "backend_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "cpu_kernels.h"
#include "config.h"
#include "log.h"
#include "safetensors.h"

bool vlmd_backend_cuda_built(void)
{
#ifdef VLMD_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

vlmd_backend_options vlmd_backend_options_of(const vlmd_config *cfg)
{
    /* the flag table allows only its choices, so the first one is the default */
    vlmd_backend_options o = {
        .device = cfg->device,
        .attention = strcmp(cfg->cuda_attention, "wmma") == 0  ? VLMD_CUDA_ATTENTION_WMMA
                     : strcmp(cfg->cuda_attention, "mma") == 0 ? VLMD_CUDA_ATTENTION_MMA
                                                               : VLMD_CUDA_ATTENTION_FA2,
        .gemv_decode = strcmp(cfg->cuda_decode_linear, "gemv") == 0,
        .decode_cores = strcmp(cfg->cuda_decode_attention, "cores") == 0,
        .pdl = strcmp(cfg->cuda_pdl, "on") == 0,
    };
    vlmd_config_devices(cfg, vlmd_config_process_rank(cfg), &o.ordinal); /* validated */
    return o;
}

bool vlmd_backend_tool_flag(vlmd_config *cfg, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if ((strcmp(a, "--device") != 0 && strncmp(a, "--cuda-", 7) != 0) || *i + 1 >= argc)
        return false;
    vlmd_error err = {0};
    if (vlmd_config_set(cfg, a + 2, argv[*i + 1], &err) != VLMD_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    *i += 1;
    return true;
}

vlmd_status vlmd_backend_create(const char *device, vlmd_backend **out, vlmd_error *err)
{
    vlmd_backend_options o = {.device = device};
    return vlmd_backend_open(&o, out, err);
}

vlmd_status vlmd_backend_open(const vlmd_backend_options *o, vlmd_backend **out, vlmd_error *err)
{
    *out = NULL;
    const char *device = o->device ? o->device : "auto";
    bool want_cuda = strcmp(device, "cuda") == 0;
    bool want_auto = strcmp(device, "auto") == 0;
    if (!want_cuda && !want_auto && strcmp(device, "cpu") != 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--device: '%s' is not auto, cpu or cuda",
                           device);
    vlmd_backend *b = calloc(1, sizeof *b);
    if (!b)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "backend: out of memory");
    vlmd_status st = VLMD_ERR_UNAVAILABLE;
    if (want_cuda || want_auto) {
#ifdef VLMD_HAVE_CUDA
        vlmd_error cuda_err = {0};
        st = vlmd_cuda_backend_open(b, o->ordinal, o, &cuda_err);
        if (st != VLMD_OK && want_cuda) {
            free(b);
            return vlmd_errorf(err, st, "--device cuda: %s", cuda_err.msg);
        }
#else
        if (want_cuda) {
            free(b);
            return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE,
                               "--device cuda: this build has no CUDA backend (nvcc was not found "
                               "when it was configured)");
        }
#endif
    }
    if (st != VLMD_OK) {
        memset(b, 0, sizeof *b);
        st = vlmd_cpu_backend_open(b, err);
    }
    if (st != VLMD_OK) {
        free(b);
        return st;
    }
    b->weight_dtype = b->kv_dtype = (vlmd_dtype)b->native_dtype; /* until a model holds */
    *out = b;
    return VLMD_OK;
}

void vlmd_backend_destroy(vlmd_backend *b)
{
    if (!b)
        return;
    b->ops->destroy(b);
    free(b);
}

const vlmd_device_info *vlmd_backend_info(const vlmd_backend *b)
{
    return &b->info;
}

vlmd_status vlmd_backend_mem_info(vlmd_backend *b, uint64_t *free_bytes, uint64_t *total_bytes,
                                  vlmd_error *err)
{
    vlmd_status st = b->ops->mem_info(b, free_bytes, total_bytes, err);
    if (st != VLMD_OK || !b->limit_bytes)
        return st;
    uint64_t used = b->allocated_bytes + b->hidden_bytes;
    uint64_t left = used < b->limit_bytes ? b->limit_bytes - used : 0;
    *total_bytes = b->limit_bytes;
    *free_bytes = left < *free_bytes ? left : *free_bytes;
    return VLMD_OK;
}

vlmd_status vlmd_backend_alloc(vlmd_backend *b, size_t bytes, void **out, vlmd_error *err)
{
    *out = NULL;
    uint64_t used = b->allocated_bytes + b->hidden_bytes;
    if (b->limit_bytes && (used > b->limit_bytes || bytes > b->limit_bytes - used))
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "cannot allocate %zu bytes: the device holds %llu "
                           "MiB and %llu MiB are in use", bytes,
                           (unsigned long long)(b->limit_bytes >> 20),
                           (unsigned long long)(used >> 20));
    vlmd_status st = b->ops->alloc(b, bytes, out, err);
    if (st == VLMD_OK) {
        b->alloc_count++;
        b->allocated_bytes += bytes;
        if (b->allocated_bytes > b->peak_bytes)
            b->peak_bytes = b->allocated_bytes;
    }
    return st;
}

uint64_t vlmd_backend_peak_bytes(const vlmd_backend *b)
{
    return b->peak_bytes;
}

void vlmd_backend_reset_peak(vlmd_backend *b)
{
    b->peak_bytes = b->allocated_bytes;
}

void vlmd_backend_limit(vlmd_backend *b, uint64_t bytes)
{
    uint64_t free_bytes = 0;
    b->limit_bytes = bytes;
    vlmd_backend_mem_info(b, &free_bytes, &b->info.total_bytes, NULL);
}

void vlmd_backend_take_hidden(vlmd_backend *b, int64_t delta)
{
    if (delta < 0 && (uint64_t)-delta > b->hidden_bytes)
        b->hidden_bytes = 0;
    else
        b->hidden_bytes = (uint64_t)((int64_t)b->hidden_bytes + delta);
}

void vlmd_backend_free(vlmd_backend *b, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    b->ops->free(b, ptr);
    b->allocated_bytes -= bytes < b->allocated_bytes ? bytes : b->allocated_bytes;
}

struct vlmd_owned_block {
    void *ptr;
    size_t bytes;
};

vlmd_status vlmd_backend_own(vlmd_backend *b, vlmd_backend_owned *o, void *p, size_t bytes,
                             vlmd_error *err)
{
    struct vlmd_owned_block *blocks = vlmd_grow(o->blocks, o->n, &o->cap, sizeof *blocks, 32);
    if (!blocks) {
        vlmd_backend_free(b, p, bytes);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of host memory");
    }
    o->blocks = blocks;
    o->blocks[o->n++] = (struct vlmd_owned_block){p, bytes};
    return VLMD_OK;
}

vlmd_status vlmd_backend_alloc_owned(vlmd_backend *b, vlmd_backend_owned *o, size_t bytes,
                                     void **out, vlmd_error *err)
{
    bytes = bytes ? bytes : 4;
    vlmd_status s = vlmd_backend_alloc(b, bytes, out, err);
    if (s == VLMD_OK && (s = vlmd_backend_own(b, o, *out, bytes, err)) != VLMD_OK)
        *out = NULL; /* own freed it */
    return s;
}

void vlmd_backend_free_owned(vlmd_backend *b, vlmd_backend_owned *o)
{
    for (size_t i = 0; i < o->n; i++)
        vlmd_backend_free(b, o->blocks[i].ptr, o->blocks[i].bytes);
    free(o->blocks);
    *o = (vlmd_backend_owned){0};
}

vlmd_status vlmd_backend_copy_to_device(vlmd_backend *b, void *dst, const void *src, size_t n,
                                        vlmd_error *err)
{
    return n ? b->ops->copy_to_device(b, dst, src, n, err) : VLMD_OK; /* src may be NULL then */
}

vlmd_status vlmd_backend_copy_to_host(vlmd_backend *b, void *dst, const void *src, size_t n,
                                      vlmd_error *err)
{
    return n ? b->ops->copy_to_host(b, dst, src, n, err) : VLMD_OK;
}

/* n floats to dst in the weight type: as activations where the types agree,
 * else narrowed on the host (the CPU's 16-bit weights) a chunk at a time. */
static vlmd_status upload_weights_f32(vlmd_backend *b, void *dst, const float *src, size_t n,
                                      vlmd_error *err)
{
    if ((int)b->weight_dtype == b->native_dtype)
        return vlmd_backend_upload_f32(b, dst, src, n, err);
    size_t es = vlmd_dtype_size(b->weight_dtype), chunk = n < 65536 ? n : 65536;
    void *tmp = malloc(chunk ? chunk * es : 1);
    if (!tmp)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory to convert weights");
    vlmd_status s = VLMD_OK;
    for (size_t at = 0; s == VLMD_OK && at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        vlmd_cpu_kernels_c.narrow(tmp, b->weight_dtype, src + at, k);
        s = vlmd_backend_copy_to_device(b, (char *)dst + at * es, tmp, k * es, err);
    }
    free(tmp);
    return s;
}

/* Widens matrix i of a tensor [..., r, c] and uploads it transposed to dst ([c, r]). */
static vlmd_status upload_transposed(vlmd_backend *b, void *dst, const vlmd_tensor_view *t,
                                     int64_t r, int64_t c, float *host, float *out,
                                     vlmd_error *err)
{
    size_t es = vlmd_dtype_size(t->dtype), n = (size_t)(r * c), count = 0;
    if (n)
        count = (size_t)vlmd_tensor_numel(t) / n;
    vlmd_status s = VLMD_OK;
    for (size_t i = 0; s == VLMD_OK && i < count; i++) {
        vlmd_tensor_view one = *t;
        one.ndim = 2;
        one.shape[0] = r, one.shape[1] = c;
        one.data = (const char *)t->data + i * n * es;
        one.nbytes = n * es;
        if ((s = vlmd_tensor_to_f32(&one, host, err)) != VLMD_OK)
            break;
        for (int64_t y = 0; y < r; y++)
            for (int64_t x = 0; x < c; x++)
                out[x * r + y] = host[y * c + x];
        s = upload_weights_f32(b, (char *)dst + i * n * vlmd_backend_weight_elem_size(b), out, n,
                               err);
    }
    return s;
}

vlmd_status vlmd_backend_upload_tensor(vlmd_backend *b, void *dst, const vlmd_tensor_view *t,
                                       bool transpose, vlmd_error *err)
{
    size_t n = (size_t)vlmd_tensor_numel(t);
    VLMD_ASSERT(!transpose || t->ndim >= 2);
    if (!transpose && t->dtype == b->weight_dtype) /* straight from the mapped file */
        return vlmd_backend_copy_to_device(b, dst, t->data, t->nbytes, err);
    size_t rows = n; /* how much is widened at once: all, or one matrix */
    if (transpose)
        rows = (size_t)(t->shape[t->ndim - 2] * t->shape[t->ndim - 1]);
    float *host = malloc(rows ? rows * sizeof *host : 1);
    float *out = transpose ? malloc(rows ? rows * sizeof *out : 1) : NULL;
    vlmd_status s;
    if (!host || (transpose && !out))
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory to widen %s", t->name);
    else if (transpose)
        s = upload_transposed(b, dst, t, t->shape[t->ndim - 2], t->shape[t->ndim - 1], host, out,
                              err);
    else if ((s = vlmd_tensor_to_f32(t, host, err)) == VLMD_OK)
        s = upload_weights_f32(b, dst, host, n, err);
    free(host);
    free(out);
    return s;
}

vlmd_status vlmd_backend_load_stacked(vlmd_backend *b, const vlmd_safetensors *st, int n,
                                      const char *const *names, int ndim, const int64_t *shapes,
                                      void **out, size_t *bytes, vlmd_error *err)
{
    const vlmd_tensor_view *t[VLMD_BACKEND_MAX_STACKED];
    VLMD_ASSERT(n > 0 && n <= VLMD_BACKEND_MAX_STACKED);
    vlmd_status s;
    *bytes = 0;
    for (int i = 0; i < n; i++) {
        if ((s = vlmd_safetensors_get(st, names[i], ndim, shapes + i * ndim, &t[i], err)) !=
            VLMD_OK)
            return s;
        *bytes += (size_t)vlmd_tensor_numel(t[i]) * vlmd_backend_weight_elem_size(b);
    }
    if (!out)
        return VLMD_OK;
    if ((s = vlmd_backend_alloc(b, *bytes, out, err)) != VLMD_OK)
        return s;
    char *dst = *out;
    for (int i = 0; s == VLMD_OK && i < n; i++) {
        s = vlmd_backend_upload_tensor(b, dst, t[i], false, err);
        vlmd_safetensors_release(st, t[i]); /* copied: not resident twice */
        dst += (size_t)vlmd_tensor_numel(t[i]) * vlmd_backend_weight_elem_size(b);
    }
    if (s != VLMD_OK) {
        vlmd_backend_free(b, *out, *bytes);
        *out = NULL;
    }
    return s;
}

size_t vlmd_backend_elem_size(const vlmd_backend *b)
{
    return b->elem_size;
}

vlmd_dtype vlmd_backend_act_dtype(const vlmd_backend *b)
{
    return (vlmd_dtype)b->native_dtype;
}

vlmd_dtype vlmd_backend_weight_dtype(const vlmd_backend *b)
{
    return b->weight_dtype;
}

size_t vlmd_backend_weight_elem_size(const vlmd_backend *b)
{
    return vlmd_dtype_size(b->weight_dtype);
}

vlmd_dtype vlmd_backend_kv_dtype(const vlmd_backend *b)
{
    return b->kv_dtype;
}

size_t vlmd_backend_kv_elem_size(const vlmd_backend *b)
{
    return vlmd_dtype_size(b->kv_dtype);
}

/* The float type of most of st's matrix bytes (F32 when it has none). */
static vlmd_dtype checkpoint_matrix_dtype(const vlmd_safetensors *st)
{
    static const vlmd_dtype kinds[] = {VLMD_DTYPE_F32, VLMD_DTYPE_BF16, VLMD_DTYPE_F16};
    size_t bytes[3] = {0};
    for (size_t i = 0; i < vlmd_safetensors_count(st); i++) {
        const vlmd_tensor_view *t = vlmd_safetensors_at(st, i);
        for (int k = 0; t->ndim >= 2 && k < 3; k++)
            bytes[k] += t->dtype == kinds[k] ? t->nbytes : 0;
    }
    int best = 0;
    for (int k = 1; k < 3; k++)
        best = bytes[k] > bytes[best] ? k : best;
    return kinds[best];
}

vlmd_status vlmd_backend_hold_weights(vlmd_backend *b, const vlmd_safetensors *st,
                                      vlmd_error *err)
{
    return vlmd_backend_hold_weight_dtype(b, checkpoint_matrix_dtype(st), err);
}

vlmd_status vlmd_backend_hold_weight_dtype(vlmd_backend *b, vlmd_dtype want, vlmd_error *err)
{
    if (b->ops->weights_as_stored) {
        if (b->weight_holders && want != b->weight_dtype)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "this %s backend holds %s weights; a %s "
                               "checkpoint needs a backend of its own", b->info.name,
                               vlmd_dtype_str(b->weight_dtype), vlmd_dtype_str(want));
        b->weight_dtype = want;
        b->kv_dtype = want == VLMD_DTYPE_F32 ? (vlmd_dtype)b->native_dtype : want;
    }
    b->weight_holders++;
    return VLMD_OK;
}

vlmd_status vlmd_backend_set_kv_dtype(vlmd_backend *b, bool fp8, vlmd_error *err)
{
    if (fp8 && !vlmd_backend_ops(b)->kv_fp8)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "the %s backend has no FP8 KV cache yet "
                           "(--kv-cache-dtype fp8): use bf16", b->info.name);
    if (fp8)
        b->kv_dtype = VLMD_DTYPE_F8_E4M3;
    else if (b->kv_dtype == VLMD_DTYPE_F8_E4M3) /* back to the weights' rule */
        b->kv_dtype = b->weight_dtype == VLMD_DTYPE_F32 ? (vlmd_dtype)b->native_dtype
                                                        : b->weight_dtype;
    return VLMD_OK;
}

void vlmd_backend_release_weights(vlmd_backend *b)
{
    VLMD_ASSERT(b->weight_holders > 0);
    b->weight_holders--;
}

vlmd_status vlmd_backend_set_threads(vlmd_backend *b, int n, vlmd_error *err)
{
    return b->ops->set_threads ? b->ops->set_threads(b, n, err) : VLMD_OK;
}

int vlmd_backend_threads(const vlmd_backend *b)
{
    return b->ops->threads ? b->ops->threads(b) : 1;
}

const char *vlmd_backend_isa(const vlmd_backend *b)
{
    return b->ops->isa ? b->ops->isa(b) : "";
}

vlmd_status vlmd_backend_upload_f32(vlmd_backend *b, void *dst, const float *src, size_t n,
                                    vlmd_error *err)
{
    return b->ops->upload_f32(b, dst, src, n, err);
}

vlmd_status vlmd_backend_download_f32(vlmd_backend *b, float *dst, const void *src, size_t n,
                                      vlmd_error *err)
{
    return b->ops->download_f32(b, dst, src, n, err);
}

vlmd_status vlmd_backend_graph_capture(vlmd_backend *b, vlmd_graph_fn fn, void *ctx,
                                       vlmd_graph **out, vlmd_error *err)
{
    *out = NULL;
    return b->ops->graph_capture(b, fn, ctx, out, err);
}

vlmd_status vlmd_backend_graph_launch(vlmd_backend *b, vlmd_graph *g, vlmd_error *err)
{
    return b->ops->graph_launch(b, g, err);
}

void vlmd_backend_graph_free(vlmd_backend *b, vlmd_graph *g)
{
    if (g)
        b->ops->graph_free(b, g);
}

vlmd_status vlmd_backend_synchronize(vlmd_backend *b, vlmd_error *err)
{
    return b->ops->synchronize(b, err);
}

int vlmd_backend_graph_kernels(const vlmd_backend *b, const vlmd_graph *g)
{
    return b->ops->graph_kernels ? b->ops->graph_kernels(g) : -1;
}

bool vlmd_backend_graphs_native(const vlmd_backend *b)
{
    return b->ops->graphs_native;
}

bool vlmd_backend_ops_take_memory(const vlmd_backend *b)
{
    return b->ops->ops_take_memory;
}

const vlmd_op_table *vlmd_backend_ops(const vlmd_backend *b)
{
    return b->op_table;
}

uint64_t vlmd_backend_alloc_count(const vlmd_backend *b)
{
    return b->alloc_count;
}

uint64_t vlmd_backend_allocated_bytes(const vlmd_backend *b)
{
    return b->allocated_bytes;
}
