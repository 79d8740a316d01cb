/* lm_quant.c - a linear's weight as the checkpoint publishes it, quantized
 * or not, into one vlmd_qweight (lm_weights.h loader_load_matrix).
 *
 * The format is decided per tensor, by what the checkpoint holds beside it
 * (config lists of what stays 16-bit differ between producers and are not
 * read): "X.weight" F8_E4M3 with "X.weight_scale_inv" (fp8 blocks) or
 * "X.weight_scale" (compressed-tensors: per channel, tensor or block);
 * "X.qweight" (AWQ or GPTQ, as quantization_config says); "X.weight_packed"
 * (compressed-tensors int4); else "X.weight" in a float type. Every part of
 * a stacked matrix (q, k, v; gate, up; the experts) is repacked on the host
 * into the one layout of kernels/qweight.h at its rows of the stack, then
 * uploaded: the codes stay 1 or 1/2 byte a weight in device memory, and the
 * plan counts those bytes. Scales become fp32 (exact from F16 and BF16). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "lm_weights.h"

typedef enum part_format {
    PART_DENSE = 0,
    PART_FP8,       /* codes + scale [ceil(rows / bo), ceil(cols / bi)], [rows(, 1)] or [(1)] */
    PART_AWQ,
    PART_GPTQ,
    PART_CT_INT4,
} part_format;

static const char *const format_names[] = {"16-bit", "fp8", "awq int4", "gptq int4",
                                           "compressed-tensors int4"};

/* A part's tensors, found and checked. */
typedef struct qpart {
    const lm_part *p;
    part_format format;
    const vlmd_tensor_view *codes, *scales, *zeros, *g_idx;
    int64_t block_rows, block_cols; /* FP8: the scale's block (0 0: one scale a row) */
    int group;                      /* INT4: columns a scale (the checkpoint's whole row: cols) */
} qpart;

/* "<base><suffix>" where base is a part's name without its "weight". */
static const vlmd_tensor_view *companion(const lm_loader *ld, const lm_part *p, const char *suffix,
                                         char *name, size_t len)
{
    size_t n = strlen(p->name);
    size_t base = n >= 6 && strcmp(p->name + n - 6, "weight") == 0 ? n - 6 : n;
    snprintf(name, len, "%.*s%s", (int)base, p->name, suffix);
    return vlmd_safetensors_find(ld->st, name);
}

static part_format format_of(const lm_loader *ld, const lm_part *p)
{
    char name[400];
    if (!p->name[0])
        return PART_DENSE;
    if (companion(ld, p, "qweight", name, sizeof name))
        return ld->m->quant.method == VLMD_QUANT_AWQ ? PART_AWQ : PART_GPTQ;
    if (companion(ld, p, "weight_packed", name, sizeof name))
        return PART_CT_INT4;
    const vlmd_tensor_view *w = vlmd_safetensors_find(ld->st, p->name);
    return w && w->dtype == VLMD_DTYPE_F8_E4M3 ? PART_FP8 : PART_DENSE;
}

/* A tensor that must be there, of one of the integer or float types. */
static vlmd_status need(const lm_loader *ld, const lm_part *p, const char *suffix, bool integer,
                        const vlmd_tensor_view **out, vlmd_error *err)
{
    char name[400];
    *out = companion(ld, p, suffix, name, sizeof name);
    if (!*out)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "missing tensor %s (the %s of %s)", name, suffix,
                           p->name);
    vlmd_dtype d = (*out)->dtype;
    bool ok = integer ? d == VLMD_DTYPE_I32 || d == VLMD_DTYPE_I64
                      : d == VLMD_DTYPE_F32 || d == VLMD_DTYPE_BF16 || d == VLMD_DTYPE_F16;
    if (!ok)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s is %s, not %s", name,
                           vlmd_dtype_str(d), integer ? "I32" : "F32, BF16 or F16");
    return VLMD_OK;
}

static vlmd_status shape_error(const vlmd_tensor_view *t, const char *want, vlmd_error *err)
{
    char got[128] = "[";
    for (int d = 0; d < t->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                 (long long)t->shape[d]);
    strncat(got, "]", sizeof got - strlen(got) - 1);
    return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s has shape %s, expected %s", t->name, got,
                       want);
}

static bool shape_is(const vlmd_tensor_view *t, int ndim, int64_t a, int64_t b)
{
    return t->ndim == ndim && (ndim < 1 || t->shape[0] == a) && (ndim < 2 || t->shape[1] == b);
}

static float f32_at(const vlmd_tensor_view *t, size_t i)
{
    uint16_t h;
    switch (t->dtype) {
    case VLMD_DTYPE_F32: {
        float f;
        memcpy(&f, (const char *)t->data + i * 4, 4);
        return f;
    }
    case VLMD_DTYPE_BF16:
        memcpy(&h, (const char *)t->data + i * 2, 2);
        return vlmd_bf16_to_f32(h);
    default:
        memcpy(&h, (const char *)t->data + i * 2, 2);
        return vlmd_f16_to_f32(h);
    }
}

static uint32_t word_at(const vlmd_tensor_view *t, size_t i)
{
    uint32_t w;
    memcpy(&w, (const char *)t->data + i * vlmd_dtype_size(t->dtype), 4); /* little-endian */
    return w;
}

/* AWQ packs output column 8c + j into nibble awq_nibble[j] of word c */
static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static int nibble(uint32_t w, int i)
{
    return (int)(w >> (4 * i) & 15);
}

/* The zero point of output row o in the checkpoint's group g of an AWQ or
 * GPTQ part: packed along the output dim (AWQ's nibble order, or plain),
 * GPTQ v1 storing z - 1. */
static int zero_point(const qpart *q, int64_t g, int64_t o, bool gptq_v2)
{
    uint32_t w = word_at(q->zeros, (size_t)(g * (q->p->rows / 8) + o / 8));
    if (q->format == PART_AWQ)
        return nibble(w, awq_nibble[o % 8]);
    return gptq_v2 ? nibble(w, (int)(o % 8)) : (nibble(w, (int)(o % 8)) + 1) & 15;
}

/* Finds and checks the tensors of an FP8 part. */
static vlmd_status fp8_part(const lm_loader *ld, qpart *q, vlmd_error *err)
{
    const lm_part *p = q->p;
    const vlmd_quant_config *qc = &ld->m->quant;
    vlmd_status s = vlmd_safetensors_get(ld->st, p->name, 2, (int64_t[]){p->rows, p->cols},
                                         &q->codes, err);
    if (s != VLMD_OK)
        return s;
    if (qc->method != VLMD_QUANT_FP8 && qc->method != VLMD_QUANT_CT_FP8)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s is F8_E4M3, but quantization_config "
                           "says no fp8 weights", p->name);
    if ((s = need(ld, p, qc->method == VLMD_QUANT_FP8 ? "weight_scale_inv" : "weight_scale", false,
                  &q->scales, err)) != VLMD_OK)
        return s;
    const vlmd_tensor_view *t = q->scales;
    int64_t bo = qc->block[0], bi = qc->block[1];
    if (bo && shape_is(t, 2, (p->rows + bo - 1) / bo, (p->cols + bi - 1) / bi)) {
        q->block_rows = bo, q->block_cols = bi;
    } else if (shape_is(t, 2, p->rows, 1) || shape_is(t, 1, p->rows, 0)) {
        q->block_rows = 1; /* one scale a row */
    } else if (shape_is(t, 0, 0, 0) || shape_is(t, 1, 1, 0)) {
        q->block_rows = 0; /* one scale for the tensor */
    } else {
        char want[128];
        if (bo)
            snprintf(want, sizeof want, "[%lld, %lld] (%lldx%lld blocks)",
                     (long long)((p->rows + bo - 1) / bo), (long long)((p->cols + bi - 1) / bi),
                     (long long)bo, (long long)bi);
        else
            snprintf(want, sizeof want, "[%lld, 1] or [1] (a scale a row or one)",
                     (long long)p->rows);
        return shape_error(t, want, err);
    }
    return VLMD_OK;
}

/* Finds and checks the tensors of a 4-bit part (qweight / weight_packed, scales, zeros). */
static vlmd_status int4_part(const lm_loader *ld, qpart *q, vlmd_error *err)
{
    const lm_part *p = q->p;
    const vlmd_quant_config *qc = &ld->m->quant;
    const int64_t rows = p->rows, cols = p->cols;
    int g = qc->group_size > 0 ? qc->group_size : (int)cols;
    char want[128];
    vlmd_status s;
    q->group = g;
    bool is_ct = q->format == PART_CT_INT4;
    if (is_ct ? qc->method != VLMD_QUANT_CT_INT4
              : qc->method != VLMD_QUANT_AWQ && qc->method != VLMD_QUANT_GPTQ)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s is stored as %s, but quantization_config "
                           "says otherwise", p->name, format_names[q->format]);
    if (cols % g || (!is_ct && (cols % 8 || rows % 8)))
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %lld x %lld is not in whole groups of %d "
                           "(and 8-column words)", p->name, (long long)rows, (long long)cols, g);
    const int64_t groups = cols / g;
    if (q->format == PART_CT_INT4) {
        if ((s = need(ld, p, "weight_packed", true, &q->codes, err)) != VLMD_OK ||
            (s = need(ld, p, "weight_scale", false, &q->scales, err)) != VLMD_OK)
            return s;
        if (!shape_is(q->codes, 2, rows, (cols + 7) / 8)) {
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)(cols + 7) / 8);
            return shape_error(q->codes, want, err);
        }
        if (!shape_is(q->scales, 2, rows, groups)) {
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)groups);
            return shape_error(q->scales, want, err);
        }
        char name[400];
        const vlmd_tensor_view *shape = companion(ld, p, "weight_shape", name, sizeof name);
        if (shape && (vlmd_tensor_numel(shape) != 2 ||
                      (shape->dtype != VLMD_DTYPE_I64 && shape->dtype != VLMD_DTYPE_I32)))
            return shape_error(shape, "two I64 or I32 sizes", err);
        if (shape) {
            int64_t dims[2];
            for (int d = 0; d < 2; d++)
                dims[d] = shape->dtype == VLMD_DTYPE_I64
                              ? ((const int64_t *)shape->data)[d]
                              : (int64_t)((const int32_t *)shape->data)[d];
            if (dims[0] != rows || dims[1] != cols)
                return vlmd_errorf(err, VLMD_ERR_MODEL, "%s says [%lld, %lld]; the model needs "
                                   "[%lld, %lld]", name, (long long)dims[0], (long long)dims[1],
                                   (long long)rows, (long long)cols);
        }
        if (companion(ld, p, "weight_zero_point", name, sizeof name))
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: asymmetric pack-quantized weights are "
                               "not supported", name);
        return VLMD_OK;
    }
    if ((s = need(ld, p, "qweight", true, &q->codes, err)) != VLMD_OK ||
        (s = need(ld, p, "qzeros", true, &q->zeros, err)) != VLMD_OK ||
        (s = need(ld, p, "scales", false, &q->scales, err)) != VLMD_OK)
        return s;
    bool awq = q->format == PART_AWQ;
    int64_t qr = awq ? cols : cols / 8, qc_ = awq ? rows / 8 : rows;
    if (!shape_is(q->codes, 2, qr, qc_)) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)qr, (long long)qc_);
        return shape_error(q->codes, want, err);
    }
    if (!shape_is(q->zeros, 2, groups, rows / 8)) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)groups, (long long)rows / 8);
        return shape_error(q->zeros, want, err);
    }
    if (!shape_is(q->scales, 2, groups, rows)) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)groups, (long long)rows);
        return shape_error(q->scales, want, err);
    }
    char name[400];
    q->g_idx = awq ? NULL : companion(ld, p, "g_idx", name, sizeof name);
    if (q->g_idx) { /* act-order permutes the groups: refused rather than misread */
        if (!shape_is(q->g_idx, 1, cols, 0) || q->g_idx->dtype != VLMD_DTYPE_I32) {
            snprintf(want, sizeof want, "[%lld] I32", (long long)cols);
            return shape_error(q->g_idx, want, err);
        }
        for (int64_t i = 0; i < cols; i++)
            if ((int64_t)(int32_t)word_at(q->g_idx, (size_t)i) != i / g)
                return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: input %lld is in group %d, not %lld: "
                                   "GPTQ act-order (desc_act) with a permuted g_idx is not "
                                   "supported; requantize with desc_act false", name,
                                   (long long)i, (int)(int32_t)word_at(q->g_idx, (size_t)i),
                                   (long long)(i / g));
    }
    return VLMD_OK;
}

/* The layout all parts share: the format, group, scale row block and zero points. */
typedef struct qlayout {
    vlmd_qformat format;
    int group;                  /* kernels' group (0: a row) */
    int row_block;
    int64_t rows, cols;         /* of the stack */
} qlayout;

/* A block [row0, row0 + n) x [col0, col0 + m) of part q into the stack's rows from `at`. */
static void repack(const qpart *q, const qlayout *L, int64_t at, uint8_t *codes, float *scales,
                   uint8_t *zeros, bool gptq_v2)
{
    const lm_part *p = q->p;
    const int64_t n = p->n_rows, m = p->n_cols, groups = L->group ? (m + L->group - 1) / L->group : 1;
    const size_t rb = vlmd_qweight_row_bytes(L->format, (int)m);
    for (int64_t r = 0; r < n; r++) {
        const int64_t o = p->row0 + r, row = at + r;
        uint8_t *c = codes + (size_t)row * rb;
        bool scale_row = row % L->row_block == 0;
        float *s = scales + (size_t)(row / L->row_block) * groups;
        uint8_t *z = zeros ? zeros + (size_t)(row / L->row_block) * groups : NULL;
        if (q->format == PART_FP8) {
            memcpy(c, (const uint8_t *)q->codes->data + (size_t)(o * p->cols + p->col0), (size_t)m);
            for (int64_t g = 0; scale_row && g < groups; g++) {
                size_t i = 0; /* per tensor */
                if (q->block_rows && q->block_cols)
                    i = (size_t)((o / q->block_rows) * q->scales->shape[1] +
                                 (p->col0 + g * L->group) / q->block_cols);
                else if (q->block_rows)
                    i = (size_t)o;
                s[g] = f32_at(q->scales, i);
            }
            continue;
        }
        memset(c, 0, rb);
        for (int64_t k = 0; k < m; k++) {
            const int64_t i = p->col0 + k;
            int v;
            if (q->format == PART_AWQ)
                v = nibble(word_at(q->codes, (size_t)(i * (p->rows / 8) + o / 8)),
                           awq_nibble[o % 8]);
            else if (q->format == PART_GPTQ)
                v = nibble(word_at(q->codes, (size_t)((i / 8) * p->rows + o)), (int)(i % 8));
            else
                v = nibble(word_at(q->codes, (size_t)(o * ((p->cols + 7) / 8) + i / 8)),
                           (int)(i % 8));
            c[k / 2] |= (uint8_t)(v << (4 * (k & 1)));
        }
        for (int64_t g = 0; g < groups; g++) {
            const int64_t gi = p->col0 / q->group + g; /* the checkpoint's group */
            if (q->format == PART_CT_INT4) {
                s[g] = f32_at(q->scales, (size_t)(o * q->scales->shape[1] + gi));
                continue;
            }
            s[g] = f32_at(q->scales, (size_t)(gi * p->rows + o));
            if (z)
                z[g] = (uint8_t)zero_point(q, gi, o, gptq_v2);
        }
    }
}

/* The stack's layout from its parts, or a refusal naming the part that does not fit. */
static vlmd_status plan_layout(const qpart *qs, int n, qlayout *L, vlmd_error *err)
{
    const lm_part *p0 = qs[0].p;
    L->format = qs[0].format == PART_FP8 ? VLMD_QFORMAT_FP8 : VLMD_QFORMAT_INT4;
    L->cols = p0->n_cols;
    L->rows = 0;
    /* the kernels' group: the checkpoint's column group, or the row */
    int group = qs[0].format == PART_FP8 ? (int)qs[0].block_cols : qs[0].group;
    if (group >= p0->cols && p0->col0 == 0)
        group = 0;
    L->group = group;
    bool blocks = qs[0].format == PART_FP8 && qs[0].block_rows > 1;
    for (int i = 0; i < n; i++) {
        const qpart *q = &qs[i];
        const lm_part *p = q->p;
        int own = q->format == PART_FP8 ? (int)q->block_cols : q->group;
        if (own >= p->cols && p->col0 == 0)
            own = 0;
        if (q->format != qs[0].format || p->n_cols != L->cols || own != group ||
            q->block_rows != qs[0].block_rows)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s (%s) cannot be stacked with %s (%s): "
                               "their layouts differ", p->name, format_names[q->format],
                               p0->name, format_names[qs[0].format]);
        if (own && p->col0 % own)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: a tensor-parallel share starting at "
                               "column %lld cuts a group of %d columns; choose a "
                               "--tensor-parallel-size that splits on group boundaries",
                               p->name, (long long)p->col0, own);
        /* scales kept per block of rows only while every part starts on one */
        if (blocks && (L->rows % q->block_rows || p->row0 % q->block_rows ||
                       (p->n_rows % q->block_rows && i != n - 1)))
            blocks = false;
        L->rows += p->n_rows;
    }
    L->row_block = blocks ? (int)qs[0].block_rows : 1;
    return VLMD_OK;
}

/* Whether any zero point of the parts' blocks is not 8 (AWQ; GPTQ stored asymmetric):
 * symmetric checkpoints keep no zero points. */
static bool asymmetric(const qpart *qs, int n, bool gptq_v2)
{
    for (int i = 0; i < n; i++) {
        const qpart *q = &qs[i];
        const lm_part *p = q->p;
        if (!q->zeros)
            continue;
        for (int64_t g = p->col0 / q->group; g < (p->col0 + p->n_cols + q->group - 1) / q->group; g++)
            for (int64_t o = p->row0; o < p->row0 + p->n_rows; o++) {
                if (zero_point(q, g, o, gptq_v2) != 8)
                    return true;
            }
    }
    return false;
}

vlmd_status loader_load_matrix(lm_loader *ld, vlmd_qweight *out, vlmd_error *err)
{
    *out = (vlmd_qweight){.row_block = 1};
    int n = ld->np;
    if (n == 0 || ld->failed || format_of(ld, &ld->parts[0]) == PART_DENSE) {
        void *w;
        vlmd_status s = loader_load(ld, &w, err);
        out->codes = w;
        return s;
    }
    ld->np = 0;
    qpart *qs = calloc((size_t)n, sizeof *qs);
    if (!qs)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    vlmd_status s = VLMD_OK;
    for (int i = 0; s == VLMD_OK && i < n; i++) {
        qpart *q = &qs[i];
        q->p = &ld->parts[i];
        q->format = format_of(ld, q->p);
        if (q->format == PART_DENSE)
            s = vlmd_errorf(err, VLMD_ERR_MODEL, "%s is not quantized but %s is: vlmd stacks "
                            "them into one matrix", q->p->name, qs[0].p->name);
        else
            s = q->format == PART_FP8 ? fp8_part(ld, q, err) : int4_part(ld, q, err);
    }
    qlayout L = {0};
    if (s == VLMD_OK)
        s = plan_layout(qs, n, &L, err);
    if (s != VLMD_OK) {
        free(qs);
        return s;
    }
    const size_t groups = L.group ? (size_t)((L.cols + L.group - 1) / L.group) : 1,
                 srows = (size_t)((L.rows + L.row_block - 1) / L.row_block),
                 code_bytes = (size_t)L.rows * vlmd_qweight_row_bytes(L.format, (int)L.cols),
                 scale_bytes = srows * groups * sizeof(float),
                 zero_bytes = asymmetric(qs, n, ld->m->quant.gptq_v2) ? srows * groups : 0;
    uint8_t *codes = NULL, *zeros = NULL;
    float *scales = NULL;
    void *dc = NULL, *ds = NULL, *dz = NULL;
    if ((s = loader_alloc(ld, code_bytes, &dc, err)) != VLMD_OK ||
        (s = loader_alloc(ld, scale_bytes, &ds, err)) != VLMD_OK ||
        (zero_bytes && (s = loader_alloc(ld, zero_bytes, &dz, err)) != VLMD_OK) || ld->m->dry)
        goto done;
    codes = malloc(code_bytes ? code_bytes : 1);
    scales = malloc(scale_bytes);
    zeros = zero_bytes ? malloc(zero_bytes) : NULL;
    if (!codes || !scales || (zero_bytes && !zeros)) {
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory to repack %s", qs[0].p->name);
        goto done;
    }
    for (int i = 0, at = 0; i < n; at += (int)qs[i].p->n_rows, i++)
        repack(&qs[i], &L, at, codes, scales, zeros, ld->m->quant.gptq_v2);
    if ((s = vlmd_backend_copy_to_device(ld->m->b, dc, codes, code_bytes, err)) != VLMD_OK ||
        (s = vlmd_backend_copy_to_device(ld->m->b, ds, scales, scale_bytes, err)) != VLMD_OK ||
        (zeros && (s = vlmd_backend_copy_to_device(ld->m->b, dz, zeros, zero_bytes, err)) !=
                      VLMD_OK))
        goto done;
    *out = (vlmd_qweight){.format = L.format, .codes = dc, .scales = ds, .zeros = dz,
                          .group = L.group, .row_block = L.row_block};
    if (L.format == VLMD_QFORMAT_FP8 && ld->m->quant.fp8_activations) /* W8A8: the weight's blocks */
        out->act_group = qs[0].block_cols ? (int)qs[0].block_cols : -1;
done:
    for (int i = 0; i < n; i++) /* copied: not resident twice */
        if (qs[i].codes)
            vlmd_safetensors_release(ld->st, qs[i].codes);
    free(codes), free(scales), free(zeros), free(qs);
    return s;
}
