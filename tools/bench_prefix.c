/* bench_prefix.c - `vlmd-bench-prefix MODEL_DIR [--device D] [--turns N]
 * [--turn-tokens N] [--gen N] [--streams N] [--stream-prompt N]
 * [--long-prompt N] [--chunk N]`: what the prefix cache and chunked prefill
 * buy, on the engine alone with random prompts, each against its own
 * baseline in the same run:
 * 1. a chat of --turns turns, each adding --turn-tokens user tokens and
 *    --gen generated ones: time to first token of every turn with the
 *    prefix cache off and on (and whether the greedy tokens agree);
 * 2. --streams requests decoding when a --long-prompt-token prompt arrives:
 *    their inter-token latency (one token per step) while it is prefilled in
 *    one step, and in --chunk-token chunks between their decode steps.
 * A benchmark, not a test: times are wall clock around engine steps (each
 * ends with the logits on the host), without HTTP or tokenization. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_text_model.h"
#include "buf.h"
#include "clock.h"
#include "config.h"
#include "engine.h"

#define MAX_REQS 1024

/* What the engine gave each request so far (req ids are small indexes). */
static struct {
    uint64_t first_ns[MAX_REQS];
    int32_t n_out[MAX_REQS];
    uint32_t cached[MAX_REQS];
    bool done[MAX_REQS];
    int32_t *record;            /* tokens of record_id go here */
    uint64_t record_id;
    int32_t emitted;            /* tokens emitted in the current step */
} got;

static void on_emit(const engine_output *o, void *ud)
{
    (void)ud;
    uint64_t id = o->req_id;
    if (o->n_tokens && !got.n_out[id])
        got.first_ns[id] = vlmd_now_ns();
    for (int32_t i = 0; i < o->n_tokens; i++) {
        if (id == got.record_id)
            got.record[got.n_out[id]] = o->tokens[i];
        got.n_out[id]++;
    }
    got.emitted += o->n_tokens;
    got.cached[id] = o->cached_tokens;
    if (o->finish != VLMD_FINISH_NONE)
        got.done[id] = true;
}

static void reset_got(void)
{
    memset(&got, 0, sizeof got);
}

static void die(const char *what, const vlmd_error *err)
{
    fprintf(stderr, "vlmd-bench-prefix: %s: %s\n", what, err->msg);
    exit(1);
}

static void submit(engine *e, uint64_t id, const uint32_t *ids, int64_t n, int64_t max_tokens)
{
    vlmd_error err = {0};
    vlmd_msg_request_submit r = {.req_id = id, .tokens = (uint32_t *)ids, .n_tokens = (uint32_t)n,
                                 .max_tokens = (uint32_t)max_tokens,
                                 .sampling = {.top_p = 1, .top_k = -1, .repetition_penalty = 1}};
    if (engine_submit(e, &r, &err) != VLMD_OK)
        die("submit", &err);
}

/* One step; returns its wall time in ms. */
static double step(engine *e)
{
    vlmd_error err = {0};
    bool worked;
    got.emitted = 0;
    uint64_t t0 = vlmd_now_ns();
    if (engine_step(e, &worked, &err) != VLMD_OK)
        die("step", &err);
    return (double)(vlmd_now_ns() - t0) / 1e6;
}

typedef struct chat_options {
    int64_t turns, turn_tokens, gen;
} chat_options;

typedef struct turn_result {
    int64_t prompt;
    uint32_t cached;
    double ttft_ms;
} turn_result;

/* The chat with the cache on or off; `conversation` gets every token. */
static void run_chat(const bench_text_model *t, const engine_config *base, const chat_options *o,
                     bool cache, uint32_t *conversation, turn_result *out)
{
    engine_config ec = *base;
    ec.prefix_cache = cache;
    vlmd_error err = {0};
    engine *e = NULL;
    if (engine_create(t->model, &ec, on_emit, NULL, &e, &err) != VLMD_OK)
        die("engine", &err);
    reset_got();
    int32_t *generated = malloc((size_t)o->gen * sizeof *generated);
    uint64_t rng = 7;
    int64_t n = 0;
    for (int64_t turn = 0; turn < o->turns; turn++) {
        bench_random_ids(&rng, conversation + n, o->turn_tokens, (uint32_t)t->mc.text.vocab_size);
        n += o->turn_tokens;
        uint64_t id = (uint64_t)turn + 1;
        got.record = generated;
        got.record_id = id;
        uint64_t t0 = vlmd_now_ns();
        submit(e, id, conversation, n, o->gen);
        while (!got.done[id])
            step(e);
        out[turn] = (turn_result){n, got.cached[id], (double)(got.first_ns[id] - t0) / 1e6};
        for (int32_t i = 0; i < got.n_out[id]; i++)
            conversation[n++] = (uint32_t)generated[i];
    }
    free(generated);
    engine_free(e);
}

typedef struct stall_options {
    int64_t streams, stream_prompt, long_prompt, chunk;
} stall_options;

typedef struct stall_result {
    int32_t steps;              /* steps until the long prompt's first token */
    double itl_before_ms;       /* median step time before it arrived */
    double itl_max_ms, itl_mean_ms; /* while it was prefilled */
    double ttft_ms;             /* of the long prompt */
    bool every_step_a_token;    /* every stream got a token every step */
} stall_result;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Streams decoding, then the long prompt, prefilled in `chunk`-token chunks
 * (0: in one step). */
static stall_result run_stall(const bench_text_model *t, const stall_options *o, int64_t chunk)
{
    enum { WARM_STEPS = 9 };
    int64_t stream_gen = WARM_STEPS + 16 + (o->long_prompt + o->chunk - 1) / o->chunk;
    engine_config ec = {
        .kv_slots = (int32_t)(o->streams * (o->stream_prompt + stream_gen) + o->long_prompt + 64),
        .max_batch_tokens = (int32_t)(o->long_prompt + o->streams),
        .max_running = (int32_t)o->streams + 1, .eos_id = -1,
        .max_model_len = (int32_t)(o->long_prompt > o->stream_prompt + stream_gen
                                       ? o->long_prompt + 1 : o->stream_prompt + stream_gen),
        .chunk_tokens = (int32_t)chunk,
        .decode_graphs = vlmd_backend_graphs_native(t->backend)}; /* as the server runs */
    vlmd_error err = {0};
    engine *e = NULL;
    if (engine_create(t->model, &ec, on_emit, NULL, &e, &err) != VLMD_OK)
        die("engine", &err);
    reset_got();
    uint64_t rng = 11;
    uint32_t *ids = malloc((size_t)o->long_prompt * sizeof *ids);
    for (int64_t s = 1; s <= o->streams; s++) {
        bench_random_ids(&rng, ids, o->stream_prompt, (uint32_t)t->mc.text.vocab_size);
        submit(e, (uint64_t)s, ids, o->stream_prompt, stream_gen);
    }
    step(e); /* their prompts */
    double before[WARM_STEPS];
    stall_result r = {.every_step_a_token = true};
    for (int i = 0; i < WARM_STEPS; i++) {
        before[i] = step(e);
        r.every_step_a_token &= got.emitted == o->streams;
    }
    qsort(before, WARM_STEPS, sizeof *before, cmp_double);
    r.itl_before_ms = before[WARM_STEPS / 2];
    uint64_t long_id = (uint64_t)o->streams + 1;
    bench_random_ids(&rng, ids, o->long_prompt, (uint32_t)t->mc.text.vocab_size);
    uint64_t t0 = vlmd_now_ns();
    submit(e, long_id, ids, o->long_prompt, 1);
    double sum = 0;
    while (!got.done[long_id]) {
        double ms = step(e);
        r.every_step_a_token &= got.emitted - (got.done[long_id] ? 1 : 0) == o->streams;
        r.itl_max_ms = ms > r.itl_max_ms ? ms : r.itl_max_ms;
        sum += ms;
        r.steps++;
    }
    r.itl_mean_ms = sum / r.steps;
    r.ttft_ms = (double)(got.first_ns[long_id] - t0) / 1e6;
    free(ids);
    engine_free(e);
    return r;
}

static bool flag_i64(int argc, char **argv, int *i, const char *name, int64_t lo, int64_t hi,
                     int64_t *out)
{
    if (strcmp(argv[*i], name) != 0 || *i + 1 >= argc)
        return false;
    long long v;
    if (vlmd_parse_i64(argv[++*i], lo, hi, &v) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-prefix: %s must be in [%lld, %lld]\n", name, (long long)lo,
                (long long)hi);
        exit(2);
    }
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    vlmd_config cfg; /* --device and --cuda-* */
    vlmd_config_init_defaults(&cfg);
    chat_options chat = {10, 500, 32};
    stall_options stall = {16, 128, 32768, 4096};
    for (int i = 1; i < argc; i++) {
        if (vlmd_backend_tool_flag(&cfg, argc, argv, &i))
            continue;
        else if (flag_i64(argc, argv, &i, "--turns", 2, MAX_REQS - 1, &chat.turns) ||
                 flag_i64(argc, argv, &i, "--turn-tokens", 1, 1 << 16, &chat.turn_tokens) ||
                 flag_i64(argc, argv, &i, "--gen", 1, 1 << 16, &chat.gen) ||
                 flag_i64(argc, argv, &i, "--streams", 1, MAX_REQS - 2, &stall.streams) ||
                 flag_i64(argc, argv, &i, "--stream-prompt", 1, 1 << 16, &stall.stream_prompt) ||
                 flag_i64(argc, argv, &i, "--long-prompt", 2, 1 << 20, &stall.long_prompt) ||
                 flag_i64(argc, argv, &i, "--chunk", 1, 1 << 20, &stall.chunk))
            continue;
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else {
            fprintf(stderr, "usage: vlmd-bench-prefix MODEL_DIR [--device auto|cpu|cuda] [--cuda-* as vlmd-llm] "
                            "[--turns N] [--turn-tokens N] [--gen N] [--streams N] "
                            "[--stream-prompt N] [--long-prompt N] [--chunk N]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: vlmd-bench-prefix MODEL_DIR [flags]\n");
        return 2;
    }
    vlmd_error err = {0};
    bench_text_model t;
    const vlmd_backend_options opts = vlmd_backend_options_of(&cfg);
    if (bench_text_model_load(dir, &opts, &t, &err) != VLMD_OK)
        die(dir, &err);
    printf("model %s on %s: %.2f GB of weights\n", t.mc.architecture,
           vlmd_backend_info(t.backend)->name, (double)t.weight_bytes / 1e9);

    /* 1. the chat, with the server's default step budget and chunk size */
    int64_t total = chat.turns * (chat.turn_tokens + chat.gen);
    engine_config base = {.kv_slots = (int32_t)(2 * total + 64), .max_batch_tokens = 8192,
                          .max_running = 4, .eos_id = -1, .max_model_len = (int32_t)total + 1,
                          .chunk_tokens = 4096,
                          .decode_graphs = vlmd_backend_graphs_native(t.backend)};
    uint32_t *conv_off = malloc((size_t)total * sizeof *conv_off);
    uint32_t *conv_on = malloc((size_t)total * sizeof *conv_on);
    turn_result *off = calloc((size_t)chat.turns, sizeof *off);
    turn_result *on = calloc((size_t)chat.turns, sizeof *on);
    run_chat(&t, &base, &chat, false, conv_off, off);
    run_chat(&t, &base, &chat, true, conv_on, on);
    bool same = memcmp(conv_off, conv_on, (size_t)total * sizeof *conv_on) == 0;
    printf("\n1. a chat of %lld turns, each %lld user + %lld generated tokens (step budget %d, "
           "chunks of %d)\n", (long long)chat.turns, (long long)chat.turn_tokens,
           (long long)chat.gen, base.max_batch_tokens, base.chunk_tokens);
    printf("%5s %8s %8s %14s %13s\n", "turn", "prompt", "cached", "TTFT off (ms)", "TTFT on (ms)");
    for (int64_t i = 0; i < chat.turns; i++)
        printf("%5lld %8lld %8u %14.2f %13.2f\n", (long long)i + 1, (long long)on[i].prompt,
               on[i].cached, off[i].ttft_ms, on[i].ttft_ms);

    /* 2. the long prompt */
    stall_result one = run_stall(&t, &stall, 0), chunked = run_stall(&t, &stall, stall.chunk);
    printf("\n2. %lld streams decoding (%lld-token prompts) when a %lld-token prompt arrives\n",
           (long long)stall.streams, (long long)stall.stream_prompt, (long long)stall.long_prompt);
    printf("%-20s %6s %17s %14s %15s %16s\n", "prefill", "steps", "ITL before (ms)",
           "ITL max (ms)", "ITL mean (ms)", "its TTFT (ms)");
    char label[32];
    snprintf(label, sizeof label, "chunks of %lld", (long long)stall.chunk);
    const stall_result *rs[2] = {&one, &chunked};
    const char *labels[2] = {"one step", label};
    for (int i = 0; i < 2; i++)
        printf("%-20s %6d %17.2f %14.2f %15.2f %16.2f\n", labels[i], rs[i]->steps,
               rs[i]->itl_before_ms, rs[i]->itl_max_ms, rs[i]->itl_mean_ms, rs[i]->ttft_ms);

    const turn_result *last_off = &off[chat.turns - 1], *last_on = &on[chat.turns - 1];
    printf("\nturn %lld TTFT: %.2f ms without the cache, %.2f ms with it (%.1fx); "
           "greedy tokens the same: %s\n", (long long)chat.turns, last_off->ttft_ms,
           last_on->ttft_ms, last_off->ttft_ms / last_on->ttft_ms, same ? "yes" : "NO");
    printf("worst inter-token latency while the long prompt prefills: %.2f ms in one step, "
           "%.2f ms in chunks (%.1fx lower); a token every step for every stream: %s\n",
           one.itl_max_ms, chunked.itl_max_ms, one.itl_max_ms / chunked.itl_max_ms,
           one.every_step_a_token && chunked.every_step_a_token ? "yes" : "NO");
    free(conv_off);
    free(conv_on);
    free(off);
    free(on);
    bench_text_model_free(&t);
    return same && one.every_step_a_token && chunked.every_step_a_token ? 0 : 1;
}
