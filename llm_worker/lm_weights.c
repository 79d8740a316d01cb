/* lm_weights.c - a model's tensors into backend memory (see lm_weights.h).
 *
 * A row block of a row-major matrix is one range of the mapped file and
 * goes up as it is; a column block is copied row by row into host memory
 * first. Each tensor is released once copied, so the checkpoint is never
 * resident twice. */
#include "lm_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void loader_init(lm_loader *ld, lm_model *m, const vlmd_safetensors *st, const int *kv_heads)
{
    *ld = (lm_loader){.m = m, .st = st, .kv_heads = kv_heads};
}

void loader_free(lm_loader *ld)
{
    free(ld->parts);
    ld->parts = NULL;
    ld->np = ld->cap = 0;
}

void loader_at(lm_loader *ld, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->at, sizeof ld->at, fmt, ap);
    va_end(ap);
}

void loader_part(lm_loader *ld, const char *suffix, int64_t rows, int64_t cols, int64_t row0,
                 int64_t n_rows, int64_t col0, int64_t n_cols)
{
    if (ld->np == ld->cap) {
        int cap = ld->cap ? 2 * ld->cap : 16;
        lm_part *parts = realloc(ld->parts, (size_t)cap * sizeof *parts);
        if (!parts) {
            ld->failed = true;
            return;
        }
        ld->parts = parts;
        ld->cap = cap;
    }
    lm_part *p = &ld->parts[ld->np++];
    *p = (lm_part){.rows = rows, .cols = cols, .row0 = row0, .n_rows = n_rows, .col0 = col0,
                   .n_cols = n_cols};
    if (suffix)
        snprintf(p->name, sizeof p->name, "%s%s", ld->at, suffix);
}

void loader_part3(lm_loader *ld, const char *suffix, int64_t rows, int64_t cols, int64_t row0,
                  int64_t n_rows)
{
    loader_part(ld, suffix, rows, cols, row0, n_rows, 0, cols);
    if (!ld->failed)
        ld->parts[ld->np - 1].unit_middle = true;
}

void loader_whole(lm_loader *ld, const char *suffix, int64_t rows, int64_t cols)
{
    loader_part(ld, suffix, rows, cols, 0, rows, 0, cols);
}

void loader_kv_rows(lm_loader *ld, const char *suffix, int64_t cols)
{
    const lm_model *m = ld->m;
    const int64_t hd = m->hd, KV = (int64_t)m->r.kv_heads * hd;
    for (int i = 0, j; i < m->nkv; i = j) {
        for (j = i + 1; j < m->nkv && ld->kv_heads[j] == ld->kv_heads[j - 1] + 1; j++)
            ;
        loader_part(ld, suffix, KV, cols, ld->kv_heads[i] * hd, (j - i) * hd, 0, cols);
    }
}

/* Uploads p's block of t to dst. */
static vlmd_status upload_part(vlmd_backend *b, void *dst, const vlmd_tensor_view *t,
                               const lm_part *p, vlmd_error *err)
{
    int64_t cols = p->cols ? p->cols : 1, n_cols = p->cols ? p->n_cols : 1;
    size_t ds = vlmd_dtype_size(t->dtype);
    vlmd_tensor_view v = *t;
    v.ndim = p->cols ? 2 : 1; /* ([rows, 1, cols] as [rows, cols]) */
    v.shape[0] = p->n_rows;
    if (p->cols)
        v.shape[1] = n_cols;
    v.nbytes = (size_t)(p->n_rows * n_cols) * ds;
    if (n_cols == cols) {
        v.data = (const char *)t->data + (size_t)(p->row0 * cols) * ds;
        return vlmd_backend_upload_tensor(b, dst, &v, false, err);
    }
    char *host = malloc(v.nbytes ? v.nbytes : 1);
    if (!host)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory for a slice of %s", t->name);
    for (int64_t r = 0; r < p->n_rows; r++)
        memcpy(host + (size_t)(r * n_cols) * ds,
               (const char *)t->data + (size_t)((p->row0 + r) * cols + p->col0) * ds,
               (size_t)n_cols * ds);
    v.data = host;
    vlmd_status s = vlmd_backend_upload_tensor(b, dst, &v, false, err);
    free(host);
    return s;
}

/* rows x cols zeros at dst, in the weight type. */
static vlmd_status upload_zeros(vlmd_backend *b, void *dst, int64_t rows, int64_t cols,
                                vlmd_error *err)
{
    vlmd_tensor_view v = {.name = "zeros", .dtype = VLMD_DTYPE_F32, .ndim = 2,
                          .shape = {rows, cols}, .nbytes = (size_t)(rows * cols) * sizeof(float)};
    void *zeros = calloc(1, v.nbytes ? v.nbytes : 1);
    if (!zeros)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    v.data = zeros;
    vlmd_status s = vlmd_backend_upload_tensor(b, dst, &v, false, err);
    free(zeros);
    return s;
}

vlmd_status loader_alloc(lm_loader *ld, size_t bytes, void **out, vlmd_error *err)
{
    *out = NULL;
    if (ld->m->dry) {
        ld->m->dry_bytes += bytes;
        return VLMD_OK;
    }
    return vlmd_backend_alloc_owned(ld->m->b, &ld->m->weights, bytes, out, err);
}

vlmd_status loader_load(lm_loader *ld, void **out, vlmd_error *err)
{
    lm_model *m = ld->m;
    size_t es = vlmd_backend_weight_elem_size(m->b), bytes = 0;
    const vlmd_tensor_view *t;
    vlmd_status s = VLMD_OK;
    int n = ld->np;
    ld->np = 0;
    *out = NULL;
    if (ld->failed)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const lm_part *p = &ld->parts[i];
        if (p->name[0] &&
            (s = p->unit_middle
                     ? vlmd_safetensors_get(ld->st, p->name, 3, (int64_t[]){p->rows, 1, p->cols},
                                            &t, err)
                     : vlmd_safetensors_get(ld->st, p->name, p->cols ? 2 : 1,
                                            (int64_t[]){p->rows, p->cols}, &t, err)) != VLMD_OK)
            return s;
        if (p->name[0] && t->dtype != VLMD_DTYPE_F32 && t->dtype != VLMD_DTYPE_BF16 &&
            t->dtype != VLMD_DTYPE_F16) /* an fp8 norm or embedding: not a format vlmd knows */
            return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s is %s where vlmd reads a 16- or "
                               "32-bit float (an %s tensor needs its scale beside it, and only "
                               "linears are quantized)", p->name, vlmd_dtype_str(t->dtype),
                               vlmd_dtype_str(t->dtype));
        bytes += (size_t)(p->n_rows * (p->cols ? p->n_cols : 1)) * es;
    }
    void *w;
    if ((s = loader_alloc(ld, bytes, &w, err)) != VLMD_OK || m->dry)
        return s;
    char *dst = w;
    for (int i = 0; s == VLMD_OK && i < n; i++) {
        const lm_part *p = &ld->parts[i];
        if (!p->name[0]) {
            s = upload_zeros(m->b, dst, p->n_rows, p->n_cols, err);
        } else {
            t = vlmd_safetensors_find(ld->st, p->name);
            s = upload_part(m->b, dst, t, p, err);
            vlmd_safetensors_release(ld->st, t); /* copied: not resident twice */
        }
        dst += (size_t)(p->n_rows * (p->cols ? p->n_cols : 1)) * es;
    }
    if (s == VLMD_OK)
        *out = w;
    return s;
}

vlmd_status loader_load_f32_rows(lm_loader *ld, const char *suffix, int64_t rows, int64_t row0,
                                 int64_t n, float **out, vlmd_error *err)
{
    char name[320];
    snprintf(name, sizeof name, "%s%s", ld->at, suffix);
    const vlmd_tensor_view *t;
    *out = NULL;
    vlmd_status s = vlmd_safetensors_get(ld->st, name, 1, (int64_t[]){rows}, &t, err);
    void *dst = NULL;
    if (s != VLMD_OK || (s = loader_alloc(ld, (size_t)n * sizeof(float), &dst, err)) != VLMD_OK ||
        ld->m->dry)
        return s;
    float *host = malloc((size_t)rows * sizeof *host);
    if (!host)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    s = vlmd_tensor_to_f32(t, host, err);
    if (s == VLMD_OK)
        s = vlmd_backend_copy_to_device(ld->m->b, dst, host + row0, (size_t)n * sizeof *host, err);
    vlmd_safetensors_release(ld->st, t);
    free(host);
    if (s == VLMD_OK)
        *out = dst;
    return s;
}

vlmd_status loader_load_f32(lm_loader *ld, const char *suffix, int64_t rows, float **out,
                            vlmd_error *err)
{
    return loader_load_f32_rows(ld, suffix, rows, 0, rows, out, err);
}

vlmd_status loader_tensor(lm_loader *ld, const char *name, int ndim, const int64_t *shape,
                          bool transpose, void *dst, size_t *at, vlmd_error *err)
{
    const vlmd_tensor_view *t;
    vlmd_status s = vlmd_safetensors_get(ld->st, name, ndim, shape, &t, err);
    if (s != VLMD_OK || ld->m->dry)
        return s;
    s = vlmd_backend_upload_tensor(ld->m->b, (char *)dst + *at, t, transpose, err);
    vlmd_safetensors_release(ld->st, t); /* copied: not resident twice */
    *at += (size_t)vlmd_tensor_numel(t) * vlmd_backend_weight_elem_size(ld->m->b);
    return s;
}

vlmd_status loader_fused_experts(lm_loader *ld, const char *name, int64_t n_experts,
                                 int64_t rows, int64_t cols, int64_t first, int64_t count,
                                 bool transpose, void *dst, vlmd_error *err)
{
    const vlmd_tensor_view *t;
    vlmd_status s = vlmd_safetensors_get(ld->st, name, 3, (int64_t[]){n_experts, rows, cols}, &t,
                                         err);
    if (s == VLMD_OK && t->dtype != VLMD_DTYPE_F32 && t->dtype != VLMD_DTYPE_BF16 &&
        t->dtype != VLMD_DTYPE_F16)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s is %s: quantized experts load from "
                           "one tensor per expert, not fused", name, vlmd_dtype_str(t->dtype));
    if (s != VLMD_OK || ld->m->dry)
        return s;
    vlmd_tensor_view v = *t;
    size_t per = (size_t)(rows * cols) * vlmd_dtype_size(t->dtype);
    v.data = (const char *)t->data + (size_t)first * per;
    v.shape[0] = count;
    v.nbytes = (size_t)count * per;
    s = vlmd_backend_upload_tensor(ld->m->b, dst, &v, transpose, err);
    vlmd_safetensors_release(ld->st, t); /* copied: not resident twice */
    return s;
}

int lm_column_unit(const vlmd_quant_config *q)
{
    switch (q->method) {
    case VLMD_QUANT_FP8:
    case VLMD_QUANT_CT_FP8:
        return q->block[1] > 0 ? q->block[1] : 1;
    case VLMD_QUANT_AWQ:
    case VLMD_QUANT_GPTQ:
    case VLMD_QUANT_CT_INT4:
        return q->group_size > 0 ? q->group_size : 1;
    default:
        return 1;
    }
}

void lm_width_share(int width, int unit, int rank, int world, int *i0, int *n)
{
    int units = (width + unit - 1) / unit, per = units / world, extra = units % world;
    int u0 = rank * per + (rank < extra ? rank : extra), un = per + (rank < extra);
    int c0 = u0 * unit, c1 = (u0 + un) * unit < width ? (u0 + un) * unit : width;
    *i0 = c0 < width ? c0 : width;
    *n = c1 - *i0 > 0 ? c1 - *i0 : 0;
}

/* The attention op gives local query head i the KV head i / (nq / count):
 * when the heads used fit that (a split of the KV heads, or a whole group of
 * query heads per KV head) each is kept once, else one per query head
 * (repeated). */
int lm_rank_kv_heads(int q0, int nq, int g, int *kv)
{
    int lo = q0 / g, n = (q0 + nq - 1) / g - lo + 1;
    bool even = nq % n == 0;
    for (int i = 0; even && i < nq; i++)
        even = (q0 + i) / g - lo == i / (nq / n);
    if (!even) {
        for (int i = 0; i < nq; i++)
            kv[i] = (q0 + i) / g;
        return nq;
    }
    for (int i = 0; i < n; i++)
        kv[i] = lo + i;
    return n;
}
