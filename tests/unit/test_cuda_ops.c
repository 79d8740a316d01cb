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
#include "test_support.h"

typedef struct pair {
    vlmd_backend *cpu, *gpu;
} pair;

static bool open_pair(pair *p)
{
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &p->cpu, &err), VLMD_OK);
    if (!test_backend_open("cuda", &p->gpu)) {
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

static uint32_t random_u32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

/* n values in [-scale, scale), already bf16 */
static float *random_floats(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = bf16_round(scale * ((float)(random_u32() >> 8) / (float)(1 << 24) * 2.0f - 1.0f));
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

/* Relative L2 error of the GPU result against the CPU one over the columns
 * [0, cols) of `rows` rows `stride` apart; prints the first mismatches. */
static void expect_close_cols(const char *what, vlmd_backend *cpu, const void *dc,
                              vlmd_backend *gpu, const void *dg, size_t rows, size_t cols,
                              size_t stride, double tol)
{
    float *c = back(cpu, dc, rows * stride), *g = back(gpu, dg, rows * stride);
    double diff = 0, norm = 0;
    int shown = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t i = r * stride; i < r * stride + cols; i++) {
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

/* The same over n contiguous values. */
static void expect_close(const char *what, vlmd_backend *cpu, const void *dc, vlmd_backend *gpu,
                         const void *dg, size_t n, double tol)
{
    expect_close_cols(what, cpu, dc, gpu, dg, 1, n, n, tol);
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
    float *gu = random_floats((size_t)n * 2 * H, 3);
    void *out[2], *res[2], *gate[2], *dxs[2];
    for (int k = 0; k < 2; k++) {
        const vlmd_op_table *op = vlmd_backend_ops(bs[k]);
        void *dt = on(bs[k], table, (size_t)V * H), *dw = on(bs[k], w, H);
        void *dx = dxs[k] = on(bs[k], x, (size_t)n * H), *di = ints_on(bs[k], ids, n);
        out[k] = on(bs[k], NULL, (size_t)n * H);
        res[k] = on(bs[k], r, (size_t)n * H);
        gate[k] = on(bs[k], NULL, (size_t)n * H);
        op->embedding(bs[k], out[k], dt, di, n, H);
        op->rmsnorm(bs[k], dx, dx, res[k], dw, n, H, 1e-6f); /* fused add, in place */
        op->silu_mul(bs[k], gate[k], on(bs[k], gu, (size_t)n * 2 * H), n, H);
    }
    expect_close("embedding", p.cpu, out[0], p.gpu, out[1], (size_t)n * H, 1e-6);
    expect_close("residual", p.cpu, res[0], p.gpu, res[1], (size_t)n * H, 1e-2);
    expect_close("rmsnorm", p.cpu, dxs[0], p.gpu, dxs[1], (size_t)n * H, 1e-2);
    expect_close("silu_mul", p.cpu, gate[0], p.gpu, gate[1], (size_t)n * H, 1e-2);
    free(table), free(w), free(x), free(r), free(gu);
    close_pair(&p);
}

Test(cuda_ops, linear_at_several_shapes)
{
    pair p;
    if (!open_pair(&p))
        return;
    /* (rows up to 8 with an input a multiple of 8: the GEMV kernel when it is chosen) */
    int shapes[][3] = {{1, 64, 96},  {17, 128, 64}, {64, 256, 512}, {3, 100, 7},
                       {2, 1032, 70}, {5, 264, 33}, {8, 1024, 40},  {7, 8, 3}};
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

/* The bias and the rotary embedding (plain and M-RoPE) on the fused qkv rows,
 * and the K/V write into scattered cache slots. */
Test(cuda_ops, rope_kv_write)
{
    pair p;
    if (!open_pair(&p))
        return;
    int n = 9, nh = 4, nkv = 2, hd = 32, n_slots = 40, stride = (nh + 2 * nkv) * hd;
    int kv_dim = nkv * hd, sections[3] = {4, 6, 6};
    int32_t pos[27], slots[9];
    for (int i = 0; i < 27; i++)
        pos[i] = (i * 3701) % 30011; /* long-context positions: the angle's precision shows */
    for (int i = 0; i < n; i++)
        slots[i] = (i * 13 + 5) % n_slots;
    for (int mrope = 0; mrope < 2; mrope++) {
        float *qkv = random_floats((size_t)n * stride, 1), *bias = random_floats(stride, 1);
        float *kc = random_floats((size_t)n_slots * kv_dim, 1);
        float *vc = random_floats((size_t)n_slots * kv_dim, 1);
        void *dqkv[2], *dk[2], *dv[2];
        vlmd_backend *bs[2] = {p.cpu, p.gpu};
        for (int b = 0; b < 2; b++) {
            dqkv[b] = on(bs[b], qkv, (size_t)n * stride);
            dk[b] = on(bs[b], kc, (size_t)n_slots * kv_dim);
            dv[b] = on(bs[b], vc, (size_t)n_slots * kv_dim);
            vlmd_rope rope = {.theta = 1e6f, .sections = mrope ? sections : NULL};
            vlmd_backend_ops(bs[b])->rope_kv_write(
                bs[b], dqkv[b], mrope ? on(bs[b], bias, stride) : NULL, dk[b], dv[b],
                ints_on(bs[b], pos, 27), ints_on(bs[b], slots, n), n, nh, nkv, hd, &rope);
        }
        expect_close_cols("rope q", p.cpu, dqkv[0], p.gpu, dqkv[1], n, (size_t)nh * hd, stride,
                          1e-2);
        expect_close("k cache", p.cpu, dk[0], p.gpu, dk[1], (size_t)n_slots * kv_dim, 1e-2);
        /* copied as it is without a bias, rounded once with one */
        expect_close("v cache", p.cpu, dv[0], p.gpu, dv[1], (size_t)n_slots * kv_dim,
                     mrope ? 1e-2 : 1e-6);
        free(qkv), free(bias), free(kc), free(vc);
    }
    close_pair(&p);
}

/* One attention launch on both backends over n_seq sequences of these
 * lengths (their slots scattered over a cache a little larger than they
 * need), q read from fused qkv rows; the outputs compared. */
static void check_attention(pair *p, int nh, int nkv, int hd, int n_seq, const int *q_len,
                            const int *kv_len, bool causal)
{
    int n_rows = 0, total = 0, kv_dim = nkv * hd, stride = (nh + 2 * nkv) * hd;
    for (int s = 0; s < n_seq; s++)
        n_rows += q_len[s], total += kv_len[s];
    int n_slots = total + 7;
    n_slots += n_slots % 7919 == 0; /* 7919 is prime: i * 7919 mod n_slots is then onto */
    int32_t *slots = malloc((size_t)total * sizeof *slots);
    for (int i = 0; i < total; i++)
        slots[i] = (int32_t)(((int64_t)i * 7919 + 3) % n_slots); /* distinct, scattered */
    float *cache_k = random_floats((size_t)n_slots * kv_dim, 1);
    float *cache_v = random_floats((size_t)n_slots * kv_dim, 1);
    float *qkv = random_floats((size_t)n_rows * stride, 1);
    void *out[2];
    vlmd_backend *bs[2] = {p->cpu, p->gpu};
    for (int b = 0; b < 2; b++) {
        int32_t *dslots = ints_on(bs[b], slots, (size_t)total);
        vlmd_attn_seq *seqs = malloc((size_t)n_seq * sizeof *seqs);
        for (int s = 0, row = 0, o = 0; s < n_seq; row += q_len[s], o += kv_len[s], s++)
            seqs[s] = (vlmd_attn_seq){row, q_len[s], kv_len[s], dslots + o};
        void *dseqs = NULL;
        cr_assert_eq(vlmd_backend_alloc(bs[b], (size_t)n_seq * sizeof *seqs, &dseqs, NULL),
                     VLMD_OK);
        vlmd_backend_copy_to_device(bs[b], dseqs, seqs, (size_t)n_seq * sizeof *seqs, NULL);
        free(seqs);
        out[b] = on(bs[b], NULL, (size_t)n_rows * nh * hd);
        vlmd_backend_ops(bs[b])->attention(
            bs[b], out[b], on(bs[b], qkv, (size_t)n_rows * stride), stride,
            on(bs[b], cache_k, (size_t)n_slots * kv_dim),
            on(bs[b], cache_v, (size_t)n_slots * kv_dim), dseqs, n_seq, n_rows, nh, nkv, hd, causal);
    }
    char what[128];
    int at = snprintf(what, sizeof what, "attention nh=%d nkv=%d hd=%d %s q/kv", nh, nkv, hd,
                      causal ? "causal" : "full");
    for (int s = 0; s < n_seq && at < (int)sizeof what; s++)
        at += snprintf(what + at, sizeof what - (size_t)at, " %d/%d", q_len[s], kv_len[s]);
    expect_close(what, p->cpu, out[0], p->gpu, out[1], (size_t)n_rows * nh * hd, 1e-2);
    free(cache_k), free(cache_v), free(qkv), free(slots);
}

/* Causal attention over a batch that mixes every case the kernels split on:
 * a fresh prefill longer than a tile, a chunk after a cached prefix, short
 * decodes, and decodes long enough to be split along the sequence; GQA
 * groups of 1, 4 and 7 (Qwen2.5-7B). */
Test(cuda_ops, attention_over_varied_sequences)
{
    pair p;
    if (!open_pair(&p))
        return;
    /* (40: a head dim the tiled kernel leaves to the simple one) */
    int shapes[][3] = {{8, 2, 32}, {28, 4, 128}, {16, 16, 64}, {12, 3, 80}, {4, 2, 40}};
    int q_len[6] = {130, 70, 1, 1, 1, 5}, kv_len[6] = {130, 370, 41, 1, 5000, 5};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        check_attention(&p, shapes[sh][0], shapes[sh][1], shapes[sh][2], 6, q_len, kv_len, true);
    close_pair(&p);
}

/* The tiled kernel's edges at random: GQA groups 1 to 8, head dims 16 to
 * 128, query counts at and around the tile sizes, cached prefixes, full
 * (vision) attention, and decode-only launches (the 16-row tiles, split
 * along long sequences). */
Test(cuda_ops, attention_at_random_shapes)
{
    pair p;
    if (!open_pair(&p))
        return;
    static const int hds[] = {16, 32, 64, 128}, groups[] = {1, 2, 3, 4, 7, 8};
    static const int edges[] = {1, 15, 16, 17, 63, 64, 65, 128};
    for (int c = 0; c < 18; c++) {
        int nkv = 1 + (int)(random_u32() % 3), group = groups[random_u32() % 6];
        int hd = hds[random_u32() % 4], n_seq = 1 + (int)(random_u32() % 4);
        bool decode = c % 3 == 2, causal = decode || random_u32() % 4 != 0;
        int q_len[4], kv_len[4];
        for (int s = 0; s < n_seq; s++) {
            q_len[s] = decode ? 1
                       : random_u32() % 2 ? edges[random_u32() % 8] : 1 + (int)(random_u32() % 130);
            int past = !causal || random_u32() % 2 ? 0 : (int)(random_u32() % 300);
            kv_len[s] = q_len[s] + (decode ? (int)(random_u32() % 700) : past);
        }
        check_attention(&p, nkv * group, nkv, hd, n_seq, q_len, kv_len, causal);
    }
    close_pair(&p);
}

/* The environment picks between ways kept until a GPU run has compared them
 * (VLMD_ATTENTION, VLMD_DECODE_LINEAR, VLMD_PDL; the other ways run
 * these tests with it set: tests/cuda_emu, tools/device/gpu-check.sh); a
 * value it does not know is refused at open. */
Test(cuda_ops, an_unknown_kernel_choice_is_refused)
{
    static const char *const cases[][3] = {
        {"VLMD_ATTENTION", "flash3", "expected mma or wmma"},
        {"VLMD_DECODE_LINEAR", "cutlass", "expected cublas or gemv"},
        {"VLMD_PDL", "yes", "expected off or on"},
    };
    vlmd_backend *b = NULL;
    if (!test_backend_open("cuda", &b))
        return;
    vlmd_backend_destroy(b);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        setenv(cases[c][0], cases[c][1], 1);
        vlmd_error err = {0};
        cr_assert_eq(vlmd_backend_create("cuda", &b, &err), VLMD_ERR_INVALID_ARG);
        char want[128];
        snprintf(want, sizeof want, "%s=%s: %s", cases[c][0], cases[c][1], cases[c][2]);
        cr_expect(strstr(err.msg, want), "%s", err.msg);
        unsetenv(cases[c][0]);
    }
}

/* The vision tower's ops: layernorm with bias (in place too), GELU in its
 * three forms (also on a negative tail, [-4.5, -2), where the erf and tanh
 * forms part by 3 to 15%: over all inputs they agree within bf16's
 * rounding), the residual add, the 2-D rotary embedding, and non-causal
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
    float *tail = random_floats(count, 1.25f);
    for (size_t i = 0; i < count; i++)
        tail[i] = bf16_round(tail[i] - 3.25f);
    void *ln[2], *ln_in_place[2], *gelu[2], *quick[2], *tanh_form[2], *tail_erf[2], *tail_tanh[2];
    vlmd_backend *bs[2] = {p.cpu, p.gpu};
    for (int b = 0; b < 2; b++) {
        const vlmd_op_table *op = vlmd_backend_ops(bs[b]);
        void *dx = on(bs[b], x, count), *dw = on(bs[b], w, dim), *db = on(bs[b], bias, dim);
        ln[b] = on(bs[b], NULL, count);
        op->layernorm(bs[b], ln[b], dx, dw, db, n, dim, 1e-6f);
        ln_in_place[b] = on(bs[b], x, count);
        op->layernorm(bs[b], ln_in_place[b], ln_in_place[b], dw, db, n, dim, 1e-6f);
        gelu[b] = on(bs[b], NULL, count);
        op->gelu(bs[b], gelu[b], dx, count, VLMD_GELU_ERF);
        quick[b] = on(bs[b], NULL, count);
        op->gelu(bs[b], quick[b], dx, count, VLMD_GELU_QUICK);
        op->add(bs[b], quick[b], on(bs[b], y, count), count);
        tanh_form[b] = on(bs[b], x, count);
        op->gelu(bs[b], tanh_form[b], tanh_form[b], count, VLMD_GELU_TANH);
        tail_erf[b] = on(bs[b], NULL, count);
        op->gelu(bs[b], tail_erf[b], on(bs[b], tail, count), count, VLMD_GELU_ERF);
        tail_tanh[b] = on(bs[b], NULL, count);
        op->gelu(bs[b], tail_tanh[b], on(bs[b], tail, count), count, VLMD_GELU_TANH);
    }
    expect_close("layernorm", p.cpu, ln[0], p.gpu, ln[1], count, 1e-2);
    expect_close("layernorm in place", p.cpu, ln_in_place[0], p.gpu, ln_in_place[1], count, 1e-2);
    expect_close("gelu", p.cpu, gelu[0], p.gpu, gelu[1], count, 1e-2);
    expect_close("quick_gelu + add", p.cpu, quick[0], p.gpu, quick[1], count, 1e-2);
    expect_close("gelu tanh in place", p.cpu, tanh_form[0], p.gpu, tanh_form[1], count, 1e-2);
    expect_close("gelu tail", p.cpu, tail_erf[0], p.gpu, tail_erf[1], count, 1e-2);
    expect_close("gelu tanh tail", p.cpu, tail_tanh[0], p.gpu, tail_tanh[1], count, 1e-2);
    free(x), free(w), free(bias), free(y), free(tail);

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
            op->attention(bs[b], out[b], dq[b], nh * hd, dk[b], on(bs[b], v, qn), dseqs, 2, rows,
                          nh, nh, hd, false);
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

/* Qwen3-VL's interpolated position embeddings: four rows of a learned table
 * (64 rows: an 8x8 grid) weighted and added to the patch rows, at the tower
 * widths of the fixture (32) and of Qwen3-VL-8B (1152), one row and many. */
Test(cuda_ops, vision_pos_embed)
{
    pair p;
    if (!open_pair(&p))
        return;
    vlmd_backend *bs[2] = {p.cpu, p.gpu};
    const int rows_of[2] = {1, 75}, dims[2] = {32, 1152}, table_rows = 64;
    for (int s = 0; s < 2; s++) {
        int n = rows_of[s], dim = dims[s];
        size_t count = (size_t)n * dim;
        float *x = random_floats(count, 1), *table = random_floats((size_t)table_rows * dim, 1);
        int32_t *ids = malloc(4 * (size_t)n * sizeof *ids);
        float *weights = malloc(4 * (size_t)n * sizeof *weights);
        for (int i = 0; i < 4 * n; i++) {
            ids[i] = (int32_t)(random_u32() % (uint32_t)table_rows);
            weights[i] = (float)(random_u32() >> 8) / (float)(1 << 24);
        }
        void *out[2];
        for (int b = 0; b < 2; b++) {
            void *dw = NULL;
            cr_assert_eq(vlmd_backend_alloc(bs[b], 4 * (size_t)n * sizeof(float), &dw, NULL),
                         VLMD_OK);
            cr_assert_eq(vlmd_backend_copy_to_device(bs[b], dw, weights,
                                                     4 * (size_t)n * sizeof(float), NULL),
                         VLMD_OK);
            out[b] = on(bs[b], x, count);
            vlmd_backend_ops(bs[b])->vision_pos_embed(bs[b], out[b],
                                                      on(bs[b], table, (size_t)table_rows * dim),
                                                      ints_on(bs[b], ids, 4 * (size_t)n), dw, n,
                                                      dim);
        }
        char what[48];
        snprintf(what, sizeof what, "vision_pos_embed n=%d dim=%d", n, dim);
        expect_close(what, p.cpu, out[0], p.gpu, out[1], count, 1e-2);
        free(x), free(table), free(ids), free(weights);
    }
    close_pair(&p);
}

/* Sampling over a real vocabulary (152064, Qwen2's): greedy, temperature
 * alone, top-k, top-p, min-p, penalties, logit biases and logprobs. The same logits and
 * random numbers: greedy rows agree exactly; a drawn token may differ only
 * where the kept set's sums round differently (rare), logprobs within 1e-2. */
Test(cuda_ops, sample_against_the_reference)
{
    pair p;
    if (!open_pair(&p))
        return;
    enum { N = 16, V = 152064, SEEN = 300 };
    float *logits = random_floats((size_t)N * V, 8);
    vlmd_seen_token seen[SEEN];
    for (int i = 0; i < SEEN; i++)
        seen[i] = (vlmd_seen_token){.id = (int32_t)(((int64_t)i * 7907) % V),
                                    .output_count = i % 3, .penalize = i % 5 != 0,
                                    .bias = i % 7 ? 0 : (float)(i % 4) - 1.5f};
    vlmd_sample_row rows[N];
    for (int i = 0; i < N; i++) {
        rows[i] = (vlmd_sample_row){.temperature = i % 4 ? 0.7f : 0, .top_p = 1,
                                    .repetition_penalty = 1, .n_top = i % 3 ? -1 : 5,
                                    .seed = 1000 + (uint64_t)i, .draw = (uint64_t)i};
        if (i % 4 == 1)
            rows[i].top_k = 50;
        if (i % 4 == 2)
            rows[i].top_p = 0.9f;
        if (i % 4 == 3)
            rows[i].min_p = 0.05f;
        if (i >= 8) { /* penalties on 300 seen tokens, biases on some */
            rows[i].repetition_penalty = 1.3f;
            rows[i].presence_penalty = 0.5f;
            rows[i].frequency_penalty = 0.25f;
            rows[i].n_seen = SEEN;
        }
    }
    vlmd_sample_out out[2][N];
    vlmd_backend *bs[2] = {p.cpu, p.gpu};
    for (int b = 0; b < 2; b++) {
        vlmd_sample_row dev_rows[N];
        void *dseen = NULL, *drows = NULL, *dout = NULL;
        cr_assert_eq(vlmd_backend_alloc(bs[b], N * sizeof seen, &dseen, NULL), VLMD_OK);
        cr_assert_eq(vlmd_backend_alloc(bs[b], sizeof dev_rows, &drows, NULL), VLMD_OK);
        cr_assert_eq(vlmd_backend_alloc(bs[b], sizeof out[b], &dout, NULL), VLMD_OK);
        for (int i = 0; i < N; i++) { /* each row its own list: sample writes raw logits there */
            vlmd_seen_token *own = (vlmd_seen_token *)dseen + (size_t)i * SEEN;
            vlmd_backend_copy_to_device(bs[b], own, seen, sizeof seen, NULL);
            dev_rows[i] = rows[i];
            dev_rows[i].seen = own;
        }
        vlmd_backend_copy_to_device(bs[b], drows, dev_rows, sizeof dev_rows, NULL);
        vlmd_backend_ops(bs[b])->sample(bs[b], dout, on(bs[b], logits, (size_t)N * V), drows, N,
                                        V);
        vlmd_backend_copy_to_host(bs[b], out[b], dout, sizeof out[b], NULL);
    }
    int differ = 0;
    for (int i = 0; i < N; i++) {
        if (rows[i].temperature <= 0)
            cr_expect_eq(out[1][i].token, out[0][i].token, "greedy row %d", i);
        differ += out[1][i].token != out[0][i].token;
        if (rows[i].n_top < 0)
            continue;
        cr_expect_eq(out[1][i].n_top, out[0][i].n_top);
        cr_expect(fabsf(out[1][i].logprob - out[0][i].logprob) < 1e-2f, "row %d logprob", i);
        for (int k = 0; k < out[0][i].n_top; k++) {
            cr_expect_eq(out[1][i].top_ids[k], out[0][i].top_ids[k], "row %d top %d", i, k);
            cr_expect(fabsf(out[1][i].top_logprobs[k] - out[0][i].top_logprobs[k]) < 1e-2f);
        }
    }
    cr_expect_leq(differ, 1, "%d of %d tokens differ", differ, N);
    free(logits);
    close_pair(&p);
}
