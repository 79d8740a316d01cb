/* stats.c - vlmd-bench's metrics. */
#include "stats.h"

#include <stdlib.h>

#include "buf.h"

double bench_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)rank;
    if (lo + 1 >= n)
        return sorted[n - 1];
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * (rank - (double)lo);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[0..n) (seconds) and describes it in milliseconds. */
static bench_dist describe(double *v, size_t n)
{
    if (n == 0)
        return (bench_dist){0};
    qsort(v, n, sizeof *v, by_value);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    return (bench_dist){sum / (double)n * 1e3, bench_percentile(v, n, 50) * 1e3,
                        bench_percentile(v, n, 99) * 1e3};
}

bool bench_summarize(const bench_result *r, size_t n, double duration_s, bench_summary *out)
{
    *out = (bench_summary){.duration_s = duration_s};
    size_t n_itl = 0;
    for (size_t i = 0; i < n; i++)
        n_itl += r[i].ok ? r[i].n_itl : 0;
    double *ttft = malloc((n + 1) * sizeof *ttft), *tpot = malloc((n + 1) * sizeof *tpot);
    double *e2el = malloc((n + 1) * sizeof *e2el), *itl = malloc((n_itl + 1) * sizeof *itl);
    bool ok = ttft && tpot && e2el && itl;
    size_t n_tpot = 0;
    n_itl = 0;
    for (size_t i = 0; ok && i < n; i++) {
        if (!r[i].ok) {
            out->failed++;
            continue;
        }
        size_t c = out->completed++;
        out->total_input_tokens += r[i].prompt_tokens;
        out->total_output_tokens += r[i].output_tokens;
        ttft[c] = r[i].ttft_s;
        e2el[c] = r[i].latency_s;
        if (r[i].output_tokens > 1)
            tpot[n_tpot++] = (r[i].latency_s - r[i].ttft_s) / (double)(r[i].output_tokens - 1);
        for (size_t k = 0; k < r[i].n_itl; k++)
            itl[n_itl++] = r[i].itl_s[k];
    }
    if (ok) {
        out->ttft = describe(ttft, out->completed);
        out->e2el = describe(e2el, out->completed);
        out->tpot = describe(tpot, n_tpot);
        out->itl = describe(itl, n_itl);
        if (duration_s > 0) {
            out->request_throughput = (double)out->completed / duration_s;
            out->output_throughput = (double)out->total_output_tokens / duration_s;
            out->total_token_throughput =
                (double)(out->total_input_tokens + out->total_output_tokens) / duration_s;
        }
    }
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    return ok;
}

void bench_print_table(FILE *f, const bench_summary *s)
{
    fprintf(f, "============ Serving Benchmark Result ============\n");
    fprintf(f, "%-40s %10zu\n", "Successful requests:", s->completed);
    fprintf(f, "%-40s %10zu\n", "Failed requests:", s->failed);
    fprintf(f, "%-40s %10.2f\n", "Benchmark duration (s):", s->duration_s);
    fprintf(f, "%-40s %10lld\n", "Total input tokens:", (long long)s->total_input_tokens);
    fprintf(f, "%-40s %10lld\n", "Total generated tokens:", (long long)s->total_output_tokens);
    fprintf(f, "%-40s %10.2f\n", "Request throughput (req/s):", s->request_throughput);
    fprintf(f, "%-40s %10.2f\n", "Output token throughput (tok/s):", s->output_throughput);
    fprintf(f, "%-40s %10.2f\n", "Total token throughput (tok/s):", s->total_token_throughput);
    const struct {
        const char *title, *abbr;
        const bench_dist *d;
    } rows[] = {{"Time to First Token", "TTFT", &s->ttft},
                {"Time per Output Token (excl. 1st token)", "TPOT", &s->tpot},
                {"Inter-token Latency", "ITL", &s->itl},
                {"End-to-end Latency", "E2EL", &s->e2el}};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        fprintf(f, "%s\n", rows[i].title);
        fprintf(f, "  %-38s %10.2f\n", "Mean (ms):", rows[i].d->mean_ms);
        fprintf(f, "  %-38s %10.2f\n", "Median (ms):", rows[i].d->median_ms);
        fprintf(f, "  %-38s %10.2f\n", "P99 (ms):", rows[i].d->p99_ms);
    }
    fprintf(f, "==================================================\n");
}

static void put_dist(json_t *o, const char *name, const bench_dist *d)
{
    char key[32];
    snprintf(key, sizeof key, "mean_%s_ms", name);
    json_object_set_new(o, key, json_real(d->mean_ms));
    snprintf(key, sizeof key, "median_%s_ms", name);
    json_object_set_new(o, key, json_real(d->median_ms));
    snprintf(key, sizeof key, "p99_%s_ms", name);
    json_object_set_new(o, key, json_real(d->p99_ms));
}

json_t *bench_summary_json(const bench_summary *s)
{
    json_t *o = json_pack("{s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f}", "completed",
                          (json_int_t)s->completed, "failed", (json_int_t)s->failed, "duration",
                          s->duration_s, "total_input_tokens", (json_int_t)s->total_input_tokens,
                          "total_output_tokens", (json_int_t)s->total_output_tokens,
                          "request_throughput", s->request_throughput, "output_throughput",
                          s->output_throughput, "total_token_throughput",
                          s->total_token_throughput);
    if (!o)
        return NULL;
    put_dist(o, "ttft", &s->ttft);
    put_dist(o, "tpot", &s->tpot);
    put_dist(o, "itl", &s->itl);
    put_dist(o, "e2el", &s->e2el);
    return o;
}

bool bench_result_add_itl(bench_result *r, double gap_s)
{
    double *p = vlmd_grow(r->itl_s, r->n_itl, &r->cap_itl, sizeof *p, 64);
    if (!p)
        return false;
    r->itl_s = p;
    r->itl_s[r->n_itl++] = gap_s;
    return true;
}

void bench_result_free(bench_result *r)
{
    free(r->itl_s);
    r->itl_s = NULL;
    r->n_itl = r->cap_itl = 0;
}
