/* test_cpu_kernels.c - every instruction set's CPU kernels (cpu_kernels.h)
 * against the plain-C table on fresh random inputs at several shapes (tails
 * not a multiple of the vector width, output ranges that start mid-matrix,
 * 1 to 16 rows), and the C table itself against double-precision brute
 * force, so the fallback is checked on every machine; and that a row's
 * GEMV and a key's score are the same bits in any batch (what makes the
 * engine's batched and recomputed tokens its tokens alone). A set this CPU lacks
 * is reported as skipped on stderr (its file still compiles in every x86-64
 * build). Also the pool: every part runs exactly once per task. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_pool.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float uniform(float scale)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return scale * ((float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
}

static float *random_floats(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++)
        x[i] = uniform(scale);
    return x;
}

/* n random weights of type t (as the C table narrows them) */
static void *random_weights(size_t n, vlmd_dtype t)
{
    float *f = random_floats(n, 1.0f);
    void *w = malloc(n * vlmd_dtype_size(t));
    cr_assert(w);
    vlmd_cpu_kernels_c.narrow(w, t, f, n);
    free(f);
    return w;
}

static const vlmd_cpu_isa fast_sets[] = {VLMD_CPU_ISA_AVX2, VLMD_CPU_ISA_AVX512,
                                         VLMD_CPU_ISA_AVX512_BF16};
static const char *const set_names[] = {"c", "avx2", "avx512", "avx512bf16"};

/* The set's table, or NULL with a line saying it is skipped here. */
static const vlmd_cpu_kernels *set_or_skip(vlmd_cpu_isa isa, const char *what)
{
    const vlmd_cpu_kernels *k = vlmd_cpu_kernels_for(isa);
    if (!k)
        fprintf(stderr, "SKIPPED: %s %s: this CPU lacks the instructions\n", what,
                set_names[isa]);
    return k;
}

/* |got - want| <= tol * mag + 1e-6 for every element, the first misses printed */
static void expect_close(const char *what, const float *got, const float *want, const float *mag,
                         size_t n, double tol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double lim = tol * (mag ? mag[i] : fabsf(want[i])) + 1e-6;
        if (!(fabs((double)got[i] - want[i]) <= lim) && bad++ < 5)
            cr_log_error("%s: [%zu] %.7g, want %.7g", what, i, got[i], want[i]);
    }
    cr_expect_eq(bad, 0, "%s: %d of %zu elements off", what, bad, n);
}

/* ---- the GEMV -------------------------------------------------------------------- */

typedef struct gemv_shape {
    int in, out, o0, o1, n;
} gemv_shape;

static const gemv_shape gemv_shapes[] = {
    {896, 896, 0, 896, 1},   {896, 131, 3, 131, 8},   {4864, 40, 16, 37, 16},
    {13, 9, 0, 9, 3},        {64, 64, 0, 64, 2},      {2051, 7, 0, 7, 5},
    {896, 48, 32, 48, 9},
};
static const vlmd_dtype weight_types[] = {VLMD_DTYPE_F32, VLMD_DTYPE_BF16, VLMD_DTYPE_F16};

/* y = x . w^T for one shape in double, with sum |x||w| for the tolerance */
static void gemv_brute(const gemv_shape *s, const float *x, const void *w, vlmd_dtype t,
                       float *want, float *mag)
{
    for (int r = 0; r < s->n; r++)
        for (int o = s->o0; o < s->o1; o++) {
            double sum = 0, abs = 0;
            for (int i = 0; i < s->in; i++) {
                double p = (double)x[(size_t)r * s->in + i] *
                           vlmd_cpu_load(w, t, (size_t)o * s->in + i);
                sum += p;
                abs += fabs(p);
            }
            want[(size_t)r * s->out + o] = (float)sum;
            mag[(size_t)r * s->out + o] = (float)abs;
        }
}

/* The kernel k on every shape and weight type against brute force; only
 * y's [o0, o1) columns are compared, the rest must stay as they were. */
static void check_gemv(const vlmd_cpu_kernels *k)
{
    void *scratch = aligned_alloc(64, VLMD_CPU_SCRATCH_BYTES);
    cr_assert(scratch);
    for (size_t si = 0; si < sizeof gemv_shapes / sizeof *gemv_shapes; si++)
        for (size_t ti = 0; ti < 3; ti++) {
            const gemv_shape *s = &gemv_shapes[si];
            vlmd_dtype t = weight_types[ti];
            size_t ny = (size_t)s->n * s->out;
            float *x = random_floats((size_t)s->n * s->in, 1.0f);
            void *w = random_weights((size_t)s->out * s->in, t);
            float *y = malloc(ny * sizeof *y), *want = malloc(ny * sizeof *y),
                  *mag = malloc(ny * sizeof *y);
            for (size_t i = 0; i < ny; i++)
                y[i] = want[i] = 1234.5f, mag[i] = 0; /* outside [o0, o1): untouched */
            gemv_brute(s, x, w, t, want, mag);
            k->gemv(y, s->out, x, s->in, w, t, s->in, s->o0, s->o1, s->n, scratch);
            /* the BF16 dot product rounds x to bf16: 2^-8 of each product */
            double tol = k->isa == VLMD_CPU_ISA_AVX512_BF16 && t == VLMD_DTYPE_BF16 ? 8e-3 : 1e-5;
            char what[96];
            snprintf(what, sizeof what, "%s gemv %s in=%d out=%d [%d,%d) n=%d", k->name,
                     vlmd_dtype_str(t), s->in, s->out, s->o0, s->o1, s->n);
            expect_close(what, y, want, mag, ny, tol);
            free(x), free(w), free(y), free(want), free(mag);
        }
    free(scratch);
}

Test(cpu_kernels, gemv_c_against_brute_force)
{
    check_gemv(&vlmd_cpu_kernels_c);
}

Test(cpu_kernels, gemv_every_set)
{
    for (size_t i = 0; i < sizeof fast_sets / sizeof *fast_sets; i++) {
        const vlmd_cpu_kernels *k = set_or_skip(fast_sets[i], "gemv");
        if (k)
            check_gemv(k);
    }
}

/* ---- a row's bits do not depend on its batch --------------------------------------- */

/* What makes a token computed in a decode step and again in a prefill (a
 * preempted request's recomputation, a batch of another size) the same
 * bits: each x row's result is the same whichever rows share the call, and
 * wherever the output range starts. The last shape's rows do not all fit
 * the scratch rounded to bf16 (the BF16 dot product takes them in passes). */
static void check_gemv_rows_invariant(const vlmd_cpu_kernels *k)
{
    static const int shapes[][2] = {{2051, 23}, {64, 50}, {150000, 5}};
    enum { N = VLMD_CPU_GEMV_MAX_ROWS };
    void *scratch = aligned_alloc(64, VLMD_CPU_SCRATCH_BYTES);
    cr_assert(scratch);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (size_t ti = 0; ti < 3; ti++) {
            int in = shapes[si][0], out = shapes[si][1];
            vlmd_dtype t = weight_types[ti];
            float *x = random_floats((size_t)N * in, 1.0f);
            void *w = random_weights((size_t)out * in, t);
            float *all = malloc((size_t)N * out * sizeof *all);
            float *some = malloc((size_t)N * out * sizeof *some);
            k->gemv(all, out, x, in, w, t, in, 0, out, N, scratch);
            int bad = 0;
            for (int n = 1; n < N; n++) { /* rows r0 .. r0 + n - 1, the outputs from o0 */
                int r0 = (n * 5) % (N - n + 1), o0 = n % 4;
                k->gemv(some, out, x + (size_t)r0 * in, in, w, t, in, o0, out, n, scratch);
                for (int r = 0; r < n; r++)
                    if (memcmp(some + (size_t)r * out + o0, all + (size_t)(r0 + r) * out + o0,
                               (size_t)(out - o0) * sizeof *some) != 0 && bad++ < 3)
                        cr_log_error("%s gemv %s in=%d: row %d of %d differs from row %d of %d",
                                     k->name, vlmd_dtype_str(t), in, r, n, r0 + r, N);
            }
            cr_expect_eq(bad, 0, "%s gemv %s in=%d: every row the same bits in any batch",
                         k->name, vlmd_dtype_str(t), in);
            free(x), free(w), free(all), free(some);
        }
    free(scratch);
}

Test(cpu_kernels, gemv_rows_are_the_same_bits_in_any_batch)
{
    check_gemv_rows_invariant(&vlmd_cpu_kernels_c);
    for (size_t i = 0; i < sizeof fast_sets / sizeof *fast_sets; i++) {
        const vlmd_cpu_kernels *k = set_or_skip(fast_sets[i], "gemv rows");
        if (k)
            check_gemv_rows_invariant(k);
    }
}

/* A key's score is the same bits whether the block ends at it (a decode's
 * last key) or goes on past it (a prefill's earlier query), for any rows. */
static void check_qk_invariant(const vlmd_cpu_kernels *k)
{
    static const int shapes[][2] = {{1, 64}, {4, 32}, {7, 80}, {14, 128}};
    enum { KB = 64 };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int rows = shapes[si][0], hd = shapes[si][1], bad = 0;
        float *q = random_floats((size_t)rows * hd, 1.0f);
        float *kt = random_floats((size_t)hd * KB, 1.0f);
        float *full = malloc((size_t)rows * KB * sizeof *full);
        float *part = malloc((size_t)rows * KB * sizeof *part);
        k->qk(full, KB, q, kt, KB, rows, KB, hd);
        for (int nk = 1; nk < KB; nk++) {
            k->qk(part, KB, q, kt, KB, rows, nk, hd);
            for (int r = 0; r < rows; r++)
                if (memcmp(part + (size_t)r * KB, full + (size_t)r * KB,
                           (size_t)nk * sizeof *part) != 0 && bad++ < 3)
                    cr_log_error("%s qk rows=%d hd=%d: row %d differs with %d keys", k->name, rows,
                                 hd, r, nk);
        }
        cr_expect_eq(bad, 0, "%s qk rows=%d hd=%d: the same bits wherever the block ends", k->name,
                     rows, hd);
        free(q), free(kt), free(full), free(part);
    }
}

Test(cpu_kernels, qk_scores_are_the_same_bits_wherever_the_block_ends)
{
    check_qk_invariant(&vlmd_cpu_kernels_c);
    for (size_t i = 0; i < sizeof fast_sets / sizeof *fast_sets; i++) {
        const vlmd_cpu_kernels *k = set_or_skip(fast_sets[i], "qk");
        if (k)
            check_qk_invariant(k);
    }
}

/* ---- conversions ----------------------------------------------------------------- */

/* widen and narrow agree with the C table bit for bit (both round to
 * nearest even), on lengths with tails, special values included. */
static void check_conversions(const vlmd_cpu_kernels *k)
{
    const size_t n = 1000 + 5;
    float *src = random_floats(n, 3.0f);
    src[0] = INFINITY, src[1] = -0.0f, src[2] = 1e-40f, src[3] = 65504.0f, src[4] = NAN;
    for (size_t ti = 0; ti < 3; ti++) {
        vlmd_dtype t = weight_types[ti];
        size_t es = vlmd_dtype_size(t);
        char *a = malloc(n * es), *b = malloc(n * es);
        float *wa = malloc(n * sizeof *wa), *wb = malloc(n * sizeof *wb);
        vlmd_cpu_kernels_c.narrow(a, t, src, n);
        k->narrow(b, t, src, n);
        cr_expect_eq(memcmp(a, b, n * es), 0, "%s narrow to %s differs from c", k->name,
                     vlmd_dtype_str(t));
        vlmd_cpu_kernels_c.widen(wa, a, t, n);
        k->widen(wb, a, t, n);
        cr_expect_eq(memcmp(wa, wb, n * sizeof *wa), 0, "%s widen of %s differs from c",
                     k->name, vlmd_dtype_str(t));
        free(a), free(b), free(wa), free(wb);
    }
    free(src);
}

Test(cpu_kernels, conversions_every_set)
{
    uint16_t h = vlmd_cpu_to_bf16(1.0f + 1.0f / 256); /* a tie: to even, 1.0 */
    cr_expect_eq(h, 0x3f80);
    cr_expect_eq(vlmd_cpu_to_bf16(1.0f + 3.0f / 256), 0x3f82); /* a tie: up to even */
    for (size_t i = 0; i < sizeof fast_sets / sizeof *fast_sets; i++) {
        const vlmd_cpu_kernels *k = set_or_skip(fast_sets[i], "conversions");
        if (k)
            check_conversions(k);
    }
}

/* ---- the attention blocks and silu_mul ------------------------------------------ */

static void check_attention_blocks(const vlmd_cpu_kernels *k)
{
    static const int shapes[][3] = {{1, 1, 64}, {7, 64, 64}, {64, 37, 128}, {3, 5, 80}};
    const vlmd_cpu_kernels *c = &vlmd_cpu_kernels_c;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int rows = shapes[si][0], nk = shapes[si][1], hd = shapes[si][2], ld = nk + 3;
        float *q = random_floats((size_t)rows * hd, 1.0f), *kt = random_floats((size_t)hd * ld, 1.0f);
        float *v = random_floats((size_t)nk * hd, 1.0f);
        float *s1 = calloc((size_t)rows * ld, sizeof(float)), *s2 = calloc((size_t)rows * ld, sizeof(float));
        char what[80];
        snprintf(what, sizeof what, "%s qk rows=%d nk=%d hd=%d", k->name, rows, nk, hd);
        c->qk(s1, ld, q, kt, ld, rows, nk, hd);
        k->qk(s2, ld, q, kt, ld, rows, nk, hd);
        float *mag = malloc((size_t)rows * ld * sizeof *mag);
        for (size_t i = 0; i < (size_t)rows * ld; i++)
            mag[i] = (float)hd; /* |q|, |k| <= 1 */
        expect_close(what, s2, s1, mag, (size_t)rows * ld, 1e-6);
        float *p = random_floats((size_t)rows * ld, 1.0f);
        float *o1 = random_floats((size_t)rows * hd, 1.0f), *o2 = malloc((size_t)rows * hd * sizeof *o2);
        memcpy(o2, o1, (size_t)rows * hd * sizeof *o2);
        c->pv(o1, p, ld, v, rows, nk, hd);
        k->pv(o2, p, ld, v, rows, nk, hd);
        snprintf(what, sizeof what, "%s pv rows=%d nk=%d hd=%d", k->name, rows, nk, hd);
        expect_close(what, o2, o1, NULL, (size_t)rows * hd, 1e-5 * nk);
        float *e1 = malloc((size_t)nk * sizeof *e1), *e2 = malloc((size_t)nk * sizeof *e2);
        float sum1 = c->exp_sum(e1, q, nk < hd ? nk : hd, 0.5f);
        float sum2 = k->exp_sum(e2, q, nk < hd ? nk : hd, 0.5f);
        snprintf(what, sizeof what, "%s exp_sum n=%d", k->name, nk < hd ? nk : hd);
        expect_close(what, e2, e1, NULL, (size_t)(nk < hd ? nk : hd), 1e-5);
        cr_expect(fabsf(sum1 - sum2) <= 1e-5f * sum1, "%s: sum %g, want %g", what, sum2, sum1);
        free(q), free(kt), free(v), free(s1), free(s2), free(mag), free(p), free(o1), free(o2),
            free(e1), free(e2);
    }
    const size_t n = 4864 + 3;
    float *g = random_floats(n, 8.0f), *u = random_floats(n, 2.0f);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    c->silu_mul(a, g, u, n);
    k->silu_mul(b, g, u, n);
    char what[48];
    snprintf(what, sizeof what, "%s silu_mul", k->name);
    expect_close(what, b, a, NULL, n, 1e-5);
    free(g), free(u), free(a), free(b);
}

Test(cpu_kernels, attention_blocks_every_set)
{
    for (size_t i = 0; i < sizeof fast_sets / sizeof *fast_sets; i++) {
        const vlmd_cpu_kernels *k = set_or_skip(fast_sets[i], "attention blocks");
        if (k)
            check_attention_blocks(k);
    }
}

Test(cpu_kernels, best_set_honours_the_cap)
{
    setenv("VLMD_CPU_ISA", "c", 1);
    cr_expect_eq(vlmd_cpu_kernels_best(), &vlmd_cpu_kernels_c);
    unsetenv("VLMD_CPU_ISA");
    const vlmd_cpu_kernels *best = vlmd_cpu_kernels_best();
    cr_expect_eq(vlmd_cpu_kernels_for(best->isa), best);
    fprintf(stderr, "cpu kernels: this CPU runs %s\n", best->name);
}

/* ---- the pool -------------------------------------------------------------------- */

typedef struct pool_ctx {
    _Atomic int hits[8];
    _Atomic int count_seen;
} pool_ctx;

static void pool_task(void *ctx, int index, int count)
{
    pool_ctx *c = ctx;
    atomic_fetch_add(&c->hits[index], 1);
    atomic_store(&c->count_seen, count);
}

Test(cpu_kernels, pool_runs_every_part_once)
{
    for (int n = 1; n <= 3; n++) {
        vlmd_cpu_pool *p = NULL;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_cpu_pool_create(n, &p, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(vlmd_cpu_pool_size(p), n);
        pool_ctx c = {0};
        const int tasks = 2000; /* on a loaded machine some find workers asleep */
        for (int t = 0; t < tasks; t++)
            vlmd_cpu_pool_run(p, pool_task, &c, false);
        for (int i = 0; i < n; i++)
            cr_expect_eq(atomic_load(&c.hits[i]), tasks, "pool of %d: part %d ran %d times", n,
                         i, atomic_load(&c.hits[i]));
        cr_expect_eq(atomic_load(&c.count_seen), n);
        pool_ctx alone = {0};
        vlmd_cpu_pool_run(p, pool_task, &alone, true);
        cr_expect_eq(atomic_load(&alone.hits[0]), 1);
        cr_expect_eq(atomic_load(&alone.count_seen), 1);
        vlmd_cpu_pool_destroy(p);
    }
    vlmd_cpu_pool_destroy(NULL);
}

Test(cpu_kernels, split_covers_the_range)
{
    for (int total = 0; total < 100; total += 7)
        for (int count = 1; count <= 5; count++) {
            int next = 0;
            for (int i = 0; i < count; i++) {
                int lo, hi;
                vlmd_cpu_split(total, 16, i, count, &lo, &hi);
                cr_expect(lo <= hi);
                if (lo < hi) {
                    cr_expect_eq(lo, next, "total %d count %d part %d", total, count, i);
                    cr_expect(lo % 16 == 0);
                    next = hi;
                }
            }
            cr_expect_eq(next, total, "total %d count %d", total, count);
        }
}
