/* bench_structured.c - vlmd-bench-structured: the cost of constrained
 * decoding at a realistic vocabulary size. For each schema: the compile
 * time (median of several), then random generations driven by the masks
 * (tokens drawn from each mask, steered toward completion) on a fresh
 * masker ("cold": states' masks computed on first use) and the same
 * generations again ("warm": every mask cached), timing each
 * vlmd_masker_fill. Prints one line per schema: median and p99 microseconds
 * per step, cold and warm, and what the masker did.
 *
 * usage: vlmd-bench-structured [--vocab N] [--walks N] [--steps N] [--seed N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "structured.h"
#include "synth_vocab.h"

typedef struct bench_schema {
    const char *name, *schema;  /* schema NULL: any JSON object */
} bench_schema;

static const bench_schema schemas[] = {
    {"flat object",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\"},"
     "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"active\":{\"type\":\"boolean\"},"
     "\"score\":{\"type\":\"number\",\"minimum\":0,\"maximum\":100}},"
     "\"required\":[\"id\",\"name\",\"email\",\"active\",\"score\"],\"additionalProperties\":false}"},
    {"nested",
     "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
     "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
     "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\",\"zip\"]}},"
     "\"required\":[\"name\",\"address\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
     "\"required\":[\"user\",\"tags\"]}"},
    {"array of objects",
     "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},"
     "\"qty\":{\"type\":\"integer\",\"minimum\":1},\"price\":{\"type\":\"number\"}},"
     "\"required\":[\"sku\",\"qty\",\"price\"]},\"minItems\":1,\"maxItems\":20}"},
    {"string with pattern",
     "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3,6}(-[a-z]+)?$\"},"
     "\"when\":{\"type\":\"string\",\"format\":\"date-time\"}},\"required\":[\"code\",\"when\"]}"},
    {"recursive tree",
     "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\"},"
     "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"label\"]}},"
     "\"$ref\":\"#/$defs/n\"}"},
    {"long counted string",
     "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\",\"minLength\":100,\"maxLength\":600}},"
     "\"required\":[\"text\"]}"},
    {"json_object", NULL},
};

/* This thread's CPU time: the mask's own cost, whatever else the machine runs. */
static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The ids set in mask, into ids; returns how many. */
static uint32_t allowed_ids(const uint32_t *mask, size_t n_words, uint32_t *ids)
{
    uint32_t n = 0;
    for (size_t w = 0; w < n_words; w++)
        for (uint32_t x = mask[w]; x; x &= x - 1)
            ids[n++] = (uint32_t)(w * 32 + (uint32_t)__builtin_ctz(x));
    return n;
}

static vlmd_status compile(const bench_schema *bs, vlmd_grammar **g, vlmd_error *err)
{
    return bs->schema ? vlmd_grammar_compile_schema(bs->schema, strlen(bs->schema), NULL, g, err)
                      : vlmd_grammar_compile_json_object(NULL, g, err);
}

/* `walks` generations of at most `steps` tokens; fill times appended to t. */
static void generate(const vlmd_grammar *g, vlmd_masker *m, const vlmd_vocab *v, uint32_t eos, int walks,
                     int steps, uint64_t seed, double *t, size_t *nt, int *ended)
{
    size_t n_words = (vlmd_vocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(n_words * sizeof *mask), *ids = malloc(n_words * 32 * sizeof *ids);
    vlmd_mask_scratch *s = vlmd_mask_scratch_create();
    *ended = 0;
    for (int w = 0; w < walks; w++) {
        uint64_t r = seed + (uint64_t)w * 7919;
        vlmd_grammar_state st;
        vlmd_grammar_state_init(g, &st);
        for (int k = 0; k < steps; k++) {
            double a = now_us();
            if (vlmd_masker_fill(m, &st, &eos, 1, mask, n_words, s, NULL) != VLMD_OK) {
                fprintf(stderr, "fill failed\n");
                exit(1);
            }
            t[(*nt)++] = now_us() - a;
            uint32_t allowed = allowed_ids(mask, n_words, ids);
            uint32_t pick = ids[rnd(&r) % allowed];
            if (rnd(&r) % 4) {  /* steer toward an end, as a trained model would get there */
                size_t best = SIZE_MAX;
                for (int c = 0; c < 512; c++) {
                    uint32_t id = ids[rnd(&r) % allowed];
                    vlmd_grammar_state x;
                    memcpy(x.w, st.w, st.w[0] * sizeof st.w[0]);
                    size_t mc = id == eos ? 0 : vlmd_masker_accept(m, &x, id) ? vlmd_grammar_min_completion(g, &x) : SIZE_MAX;
                    if (mc < best) {
                        best = mc;
                        pick = id;
                    }
                }
            }
            if (pick == eos) {
                (*ended)++;
                break;
            }
            vlmd_masker_accept(m, &st, pick);
        }
    }
    free(mask);
    free(ids);
    vlmd_mask_scratch_free(s);
}

int main(int argc, char **argv)
{
    uint32_t n_vocab = 150000;
    int walks = 20, steps = 200;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab"))
            n_vocab = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--walks"))
            walks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            seed = (uint64_t)atoll(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--vocab N] [--walks N] [--steps N] [--seed N]\n", argv[0]);
            return 2;
        }
    }
    synth_vocab sv;
    double a = now_us();
    if (!synth_vocab_make(n_vocab, 3, 42, &sv)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    vlmd_vocab *v = NULL;
    vlmd_error err = {0};
    double b = now_us();
    if (vlmd_vocab_create(sv.n, (const uint8_t *const *)sv.bytes, sv.lens, &v, &err) != VLMD_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("vocabulary: %u synthetic tokens (made in %.0f ms), trie built in %.0f ms\n", n_vocab,
           (b - a) / 1e3, (now_us() - b) / 1e3);
    printf("%d generations of at most %d tokens per schema; microseconds per vlmd_masker_fill\n\n", walks, steps);
    printf("| schema | compile ms | states | steps | warm median | warm p99 | cold median | cold p99 | cold max "
           "| states walked | contexts | stack checks/step | deep checks | cache MiB |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    uint32_t eos = n_vocab - 3;
    size_t cap = (size_t)walks * (size_t)steps;
    double *cold = malloc(cap * sizeof *cold), *warm = malloc(cap * sizeof *warm);
    for (size_t k = 0; k < sizeof schemas / sizeof *schemas; k++) {
        const bench_schema *bs = &schemas[k];
        double ct[7];
        vlmd_grammar *g = NULL;
        for (int r = 0; r < 7; r++) {
            vlmd_grammar_free(g);
            double t0 = now_us();
            if (compile(bs, &g, &err) != VLMD_OK) {
                fprintf(stderr, "%s: %s\n", bs->name, err.msg);
                return 1;
            }
            ct[r] = now_us() - t0;
        }
        vlmd_masker *m = NULL;
        vlmd_masker_create(g, v, &m, NULL);
        size_t nc = 0, nw = 0;
        int ended_cold, ended_warm;
        generate(g, m, v, eos, walks, steps, seed, cold, &nc, &ended_cold);
        vlmd_masker_stats s1;
        vlmd_masker_get_stats(m, &s1);
        generate(g, m, v, eos, walks, steps, seed, warm, &nw, &ended_warm);
        vlmd_masker_stats s2;
        vlmd_masker_get_stats(m, &s2);
        double cold_max = pct(cold, nc, 1.0);
        printf("| %s | %.2f | %u | %zu (%d ended) | %.1f | %.1f | %.1f | %.1f | %.0f | %llu | %llu | %.1f | %llu | %.1f |\n",
               bs->name, pct(ct, 7, 0.5) / 1e3, vlmd_grammar_n_states(g), nw, ended_warm, pct(warm, nw, 0.5),
               pct(warm, nw, 0.99), pct(cold, nc, 0.5), pct(cold, nc, 0.99), cold_max,
               (unsigned long long)s1.states_computed, (unsigned long long)s2.contexts_computed,
               (double)(s2.stack_checks - s1.stack_checks) / (double)(nw ? nw : 1),
               (unsigned long long)s2.deep_checks, (double)s2.cache_bytes / (1 << 20));
        vlmd_masker_free(m);
        vlmd_grammar_free(g);
    }
    free(cold);
    free(warm);
    vlmd_vocab_free(v);
    synth_vocab_free(&sv);
    return 0;
}
