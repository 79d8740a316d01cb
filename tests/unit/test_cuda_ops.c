/* test_cuda_ops.c - every op of the CUDA backend against the CPU reference on
 * fresh random inputs at several shapes (STYLE.md habit 8). Inputs are
 * rounded to bf16 first so both backends see the same numbers; outputs are
 * compared by relative L2 error (bf16 outputs: < 1e-2). Without a GPU the
 * CUDA backend must refuse clearly; that is what the test checks there. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ops.h"
#include "safetensors.h"

typedef struct pair {
    vlmd_backend *cpu, *gpu;
} pair;

static bool open_pair(pair *p)
{
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &p->cpu, &err), VLMD_OK);
    if (vlmd_backend_create("cuda", &p->gpu, &err) != VLMD_OK) {
        cr_expect(strstr(err.msg, "--device cuda"), "a clear refusal: %s", err.msg);
        vlmd_backend_destroy(p->cpu);
        return false;
    }
    cr_assert_not_null(vlmd_backend_ops(p->gpu), "the CUDA backend runs models");
    return true;
}

static void close_pair(pair *p)
{
    vlmd_backend_destroy(p->cpu);
    vlmd_backend_destroy(p->gpu);
}

static uint64_t rng = 0x12345;

static float bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* n values in [-scale, scale), already bf16 */
static float *random_floats(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = bf16_round(scale * ((float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f));
    }
    return x;
}

/* A buffer of n elements on backend b holding host (NULL: uninitialized). */
static void *on(vlmd_backend *b, const float *host, size_t n)
{
    void *d = NULL;
    cr_assert_eq(vlmd_backend_alloc(b, n * vlmd_backend_elem_size(b), &d, NULL), VLMD_OK);
    if (host)
        cr_assert_eq(vlmd_backend_upload_f32(b, d, host, n, NULL), VLMD_OK);
    return d;
}

static void *ints_on(vlmd_backend *b, const int32_t *host, size_t n)
{
    void *d = NULL;
    cr_assert_eq(vlmd_backend_alloc(b, n * sizeof(int32_t), &d, NULL), VLMD_OK);
    cr_assert_eq(vlmd_backend_copy_to_device(b, d, host, n * sizeof(int32_t), NULL), VLMD_OK);
    return d;
}

static float *back(vlmd_backend *b, const void *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    cr_assert_eq(vlmd_backend_download_f32(b, h, d, n, NULL), VLMD_OK);
    return h;
}

/* Relative L2 error of the GPU result against the CPU one; prints the first mismatches. */
static void expect_close(const char *what, vlmd_backend *cpu, const void *dc, vlmd_backend *gpu,
                         const void *dg, size_t n, double tol)
{
    float *c = back(cpu, dc, n), *g = back(gpu, dg, n);
    double diff = 0, norm = 0;
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)c[i] - g[i];
        diff += d * d;
        norm += (double)c[i] * c[i];
        if (!isfinite(g[i]) || (fabs(d) > 0.05 * fabs(c[i]) + 0.02 && shown < 5)) {
            cr_log_info("%s[%zu]: cpu %g gpu %g", what, i, c[i], g[i]);
            shown++;
        }
    }
    double rel = sqrt(diff / (norm > 0 ? norm : 1));
    cr_expect_lt(rel, tol, "%s: relative error %.3g", what, rel);
    free(c);
    free(g);
}

Test(cuda_ops, embedding_rmsnorm_silu)
{
    pair p;
    if (!open_pair(&p))
        return;
    int V = 100, H = 256, n = 7;
    float *table = random_floats((size_t)V * H, 1), *w = random_floats((size_t)H, 1);
    float *x = random_floats((size_t)n * H, 2), *r = random_floats((size_t)n * H, 2);
    int32_t ids[7] = {0, 5, 99, 5, 42, 17, 63};
    vlmd_backend *bs[2] = {p.cpu, p.gpu};
    void *out[2], *res[2], *gate[2];
    for (int k = 0; k < 2; k++) {
        const vlmd_op_table *op = vlmd_backend_ops(bs[k]);
        void *dt = on(bs[k], table, (size_t)V * H), *dw = on(bs[k], w, H);
        void *dx = on(bs[k], x, (size_t)n * H), *di = ints_on(bs[k], ids, n);
        out[k] = on(bs[k], NULL, (size_t)n * H);
        res[k] = on(bs[k], r, (size_t)n * H);
        gate[k] = on(bs[k], NULL, (size_t)n * H);
        op->embedding(bs[k], out[k], dt, di, n, H);
        op->rmsnorm(bs[k], dx, dx, res[k], dw, n, H, 1e-6f); /* fused add, in place */
        op->silu_mul(bs[k], gate[k], dx, out[k], n, H);
    }
    expect_close("embedding", p.cpu, out[0], p.gpu, out[1], (size_t)n * H, 1e-6);
    expect_close("residual", p.cpu, res[0], p.gpu, res[1], (size_t)n * H, 1e-2);
    expect_close("silu_mul(rmsnorm)", p.cpu, gate[0], p.gpu, gate[1], (size_t)n * H, 1e-2);
    free(table), free(w), free(x), free(r);
    close_pair(&p);
}

Test(cuda_ops, linear_at_several_shapes)
{
    pair p;
    if (!open_pair(&p))
        return;
    int shapes[][3] = {{1, 64, 96}, {17, 128, 64}, {64, 256, 512}, {3, 100, 7}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], in = shapes[s][1], o = shapes[s][2];
        float *x = random_floats((size_t)n * in, 1), *w = random_floats((size_t)o * in, 0.1f);
        float *bias = random_floats((size_t)o, 0.5f);
        void *out[2];
        vlmd_backend *bs[2] = {p.cpu, p.gpu};
        for (int k = 0; k < 2; k++) {
            out[k] = on(bs[k], NULL, (size_t)n * o);
            vlmd_backend_ops(bs[k])->linear(bs[k], out[k], on(bs[k], x, (size_t)n * in),
                                            on(bs[k], w, (size_t)o * in),
                                            s % 2 ? NULL : on(bs[k], bias, o), n, in, o);
        }
        char what[64];
        snprintf(what, sizeof what, "linear %dx%dx%d", n, in, o);
        expect_close(what, p.cpu, out[0], p.gpu, out[1], (size_t)n * o, 1e-2);
        free(x), free(w), free(bias);
    }
    close_pair(&p);
}

Test(cuda_ops, rope_and_mrope)
{
    pair p;
    if (!open_pair(&p))
        return;
    int n = 9, nh = 4, nkv = 2, hd = 32;
    int sections[3] = {4, 6, 6};
    int32_t pos[27];
    for (int i = 0; i < 27; i++)
        pos[i] = (i * 37) % 101;
    for (int mrope = 0; mrope < 2; mrope++) {
        float *q = random_floats((size_t)n * nh * hd, 1), *k = random_floats((size_t)n * nkv * hd, 1);
        void *dq[2], *dk[2];
        vlmd_backend *bs[2] = {p.cpu, p.gpu};
        for (int b = 0; b < 2; b++) {
            dq[b] = on(bs[b], q, (size_t)n * nh * hd);
            dk[b] = on(bs[b], k, (size_t)n * nkv * hd);
            vlmd_backend_ops(bs[b])->rope(bs[b], dq[b], dk[b], ints_on(bs[b], pos, 27), n, nh,
                                          nkv, hd, 1e6f, mrope ? sections : NULL);
        }
        expect_close("rope q", p.cpu, dq[0], p.gpu, dq[1], (size_t)n * nh * hd, 1e-2);
        expect_close("rope k", p.cpu, dk[0], p.gpu, dk[1], (size_t)n * nkv * hd, 1e-2);
        free(q), free(k);
    }
    close_pair(&p);
}

Test(cuda_ops, kv_write_and_attention_over_varied_sequences)
{
    pair p;
    if (!open_pair(&p))
        return;
    for (int hd = 32; hd <= 128; hd *= 4) {
        int nh = 8, nkv = 2, kv_dim = nkv * hd, n_slots = 64;
        /* three sequences: a prefill of 5, a chunk of 3 after 9 cached, a decode after 40 */
        int q_len[3] = {5, 3, 1}, kv_len[3] = {5, 12, 41}, n_rows = 9;
        int32_t slots[58], step_slots[9];
        for (int i = 0; i < 58; i++)
            slots[i] = (i * 7 + 3) % n_slots; /* distinct, scattered */
        float *cache_k = random_floats((size_t)n_slots * kv_dim, 1);
        float *cache_v = random_floats((size_t)n_slots * kv_dim, 1);
        float *q = random_floats((size_t)n_rows * nh * hd, 1);
        float *k = random_floats((size_t)n_rows * kv_dim, 1), *v = random_floats((size_t)n_rows * kv_dim, 1);
        vlmd_attn_seq host[3];
        int off = 0, row = 0;
        for (int s = 0; s < 3; s++) {
            for (int i = 0; i < q_len[s]; i++)
                step_slots[row + i] = slots[off + kv_len[s] - q_len[s] + i];
            host[s] = (vlmd_attn_seq){row, q_len[s], kv_len[s], NULL};
            row += q_len[s];
            off += kv_len[s];
        }
        void *out[2], *kc[2], *vc[2];
        vlmd_backend *bs[2] = {p.cpu, p.gpu};
        for (int b = 0; b < 2; b++) {
            const vlmd_op_table *op = vlmd_backend_ops(bs[b]);
            int32_t *dslots = ints_on(bs[b], slots, 58);
            vlmd_attn_seq seqs[3];
            for (int s = 0, o2 = 0; s < 3; o2 += kv_len[s], s++) {
                seqs[s] = host[s];
                seqs[s].slots = dslots + o2;
            }
            void *dseqs = NULL;
            cr_assert_eq(vlmd_backend_alloc(bs[b], sizeof seqs, &dseqs, NULL), VLMD_OK);
            vlmd_backend_copy_to_device(bs[b], dseqs, seqs, sizeof seqs, NULL);
            kc[b] = on(bs[b], cache_k, (size_t)n_slots * kv_dim);
            vc[b] = on(bs[b], cache_v, (size_t)n_slots * kv_dim);
            out[b] = on(bs[b], NULL, (size_t)n_rows * nh * hd);
            op->kv_write(bs[b], kc[b], vc[b], on(bs[b], k, (size_t)n_rows * kv_dim),
                         on(bs[b], v, (size_t)n_rows * kv_dim), ints_on(bs[b], step_slots, 9),
                         n_rows, kv_dim);
            op->attention(bs[b], out[b], on(bs[b], q, (size_t)n_rows * nh * hd), kc[b], vc[b],
                          dseqs, 3, n_rows, nh, nkv, hd, true);
        }
        expect_close("kv cache", p.cpu, kc[0], p.gpu, kc[1], (size_t)n_slots * kv_dim, 1e-6);
        char what[32];
        snprintf(what, sizeof what, "attention hd=%d", hd);
        expect_close(what, p.cpu, out[0], p.gpu, out[1], (size_t)n_rows * nh * hd, 1e-2);
        free(cache_k), free(cache_v), free(q), free(k), free(v);
    }
    close_pair(&p);
}

/* The vision tower's ops: layernorm with bias (in place too), GELU in both
 * forms, the residual add, the 2-D rotary embedding, and non-causal
 * attention over whole images (head dims 80, as the Qwen2-VL towers have,
 * and 64). */
Test(cuda_ops, vision_ops)
{
    pair p;
    if (!open_pair(&p))
        return;
    int n = 13, dim = 160;
    size_t count = (size_t)n * dim;
    float *x = random_floats(count, 2), *w = random_floats((size_t)dim, 1);
    float *bias = random_floats((size_t)dim, 0.5f), *y = random_floats(count, 1);
    void *ln[2], *ln_in_place[2], *gelu[2], *quick[2];
    vlmd_backend *bs[2] = {p.cpu, p.gpu};
    for (int b = 0; b < 2; b++) {
        const vlmd_op_table *op = vlmd_backend_ops(bs[b]);
        void *dx = on(bs[b], x, count), *dw = on(bs[b], w, dim), *db = on(bs[b], bias, dim);
        ln[b] = on(bs[b], NULL, count);
        op->layernorm(bs[b], ln[b], dx, dw, db, n, dim, 1e-6f);
        ln_in_place[b] = on(bs[b], x, count);
        op->layernorm(bs[b], ln_in_place[b], ln_in_place[b], dw, db, n, dim, 1e-6f);
        gelu[b] = on(bs[b], NULL, count);
        op->gelu(bs[b], gelu[b], dx, count, false);
        quick[b] = on(bs[b], NULL, count);
        op->gelu(bs[b], quick[b], dx, count, true);
        op->add(bs[b], quick[b], on(bs[b], y, count), count);
    }
    expect_close("layernorm", p.cpu, ln[0], p.gpu, ln[1], count, 1e-2);
    expect_close("layernorm in place", p.cpu, ln_in_place[0], p.gpu, ln_in_place[1], count, 1e-2);
    expect_close("gelu", p.cpu, gelu[0], p.gpu, gelu[1], count, 1e-2);
    expect_close("quick_gelu + add", p.cpu, quick[0], p.gpu, quick[1], count, 1e-2);
    free(x), free(w), free(bias), free(y);

    for (int hd = 64; hd <= 80; hd += 16) {
        int nh = 4, len[2] = {16, 45}, rows = 61;
        int32_t hpos[61], wpos[61], slots[61];
        for (int i = 0; i < rows; i++) {
            hpos[i] = (i / 7) % 9; /* a patch grid's row and column */
            wpos[i] = i % 7;
            slots[i] = i;
        }
        size_t qn = (size_t)rows * nh * hd;
        float *q = random_floats(qn, 1), *k = random_floats(qn, 1), *v = random_floats(qn, 1);
        void *dq[2], *dk[2], *out[2];
        for (int b = 0; b < 2; b++) {
            const vlmd_op_table *op = vlmd_backend_ops(bs[b]);
            dq[b] = on(bs[b], q, qn);
            dk[b] = on(bs[b], k, qn);
            op->vision_rope(bs[b], dq[b], dk[b], ints_on(bs[b], hpos, rows),
                            ints_on(bs[b], wpos, rows), rows, nh, hd, 10000.0f);
            int32_t *dslots = ints_on(bs[b], slots, rows);
            vlmd_attn_seq seqs[2] = {{0, len[0], len[0], dslots},
                                     {len[0], len[1], len[1], dslots + len[0]}};
            void *dseqs = NULL;
            cr_assert_eq(vlmd_backend_alloc(bs[b], sizeof seqs, &dseqs, NULL), VLMD_OK);
            vlmd_backend_copy_to_device(bs[b], dseqs, seqs, sizeof seqs, NULL);
            out[b] = on(bs[b], NULL, qn);
            /* the tower's attention reads K and V straight from its rows: slot i is row i */
            op->attention(bs[b], out[b], dq[b], dk[b], on(bs[b], v, qn), dseqs, 2, rows, nh, nh,
                          hd, false);
        }
        char what[48];
        snprintf(what, sizeof what, "vision_rope q hd=%d", hd);
        expect_close(what, p.cpu, dq[0], p.gpu, dq[1], qn, 1e-2);
        snprintf(what, sizeof what, "vision_rope k hd=%d", hd);
        expect_close(what, p.cpu, dk[0], p.gpu, dk[1], qn, 1e-2);
        snprintf(what, sizeof what, "non-causal attention hd=%d", hd);
        expect_close(what, p.cpu, out[0], p.gpu, out[1], qn, 1e-2);
        free(q), free(k), free(v);
    }
    close_pair(&p);
}
