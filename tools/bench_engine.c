/* bench_engine.c - `vlmd-bench-engine MODEL_DIR [--device D] [--prompt N] [--gen N]
 * [--batch B] [--bandwidth-gbs X] [--gemm-tflops Y] [--threads N] [--enforce-eager]
 * [--schema FILE|json_object]: the engine alone, in
 * this process, on random prompts: time of the prefill step(s), then decode
 * steps until every request has its --gen tokens (end-of-sequence ignored).
 * Prints tokens/s; for decode, the fraction of the weight-streaming ceiling
 * (weight bytes / --bandwidth-gbs, measured on the machine); for prefill, the
 * achieved TFLOP/s (the linear layers' 2 FLOPs per weight per token, plus
 * causal attention's 2 n^2 per query dimension and layer) against --gemm-tflops
 * (the bf16 GEMM rate measured on the machine). Decode steps replay CUDA graphs
 * on a GPU unless --enforce-eager (as the server does). --schema holds every request's
 * output to a JSON Schema (a file) or to any JSON object, matched against the model
 * directory's tokenizer.json (constrained decoding: a mask per row and step); an answer
 * then ends when its value is complete, so decode tokens/s counts the tokens made. A
 * benchmark, not a test; the
 * serving benchmark through HTTP is vlmd-bench's job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_text_model.h"
#include "buf.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "structured.h"
#include "tokenizer.h"

static int32_t finished;
static long long emitted;

static void on_emit(const engine_output *o, void *ud)
{
    (void)ud;
    emitted += o->n_tokens;
    if (o->finish != VLMD_FINISH_NONE)
        finished++;
}

/* The vocabulary and an end token of dir's tokenizer.json (constrained decoding). */
static vlmd_status load_vocab(const char *dir, vlmd_vocab **vocab, uint32_t *end, vlmd_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    vlmd_tokenizer *tok = NULL;
    vlmd_status st = vlmd_tokenizer_load(path, &tok, err);
    if (st == VLMD_OK)
        st = vlmd_vocab_from_tokenizer(tok, vocab, err);
    int64_t id = st == VLMD_OK ? vlmd_tokenizer_find(tok, "<|im_end|>") : -1;
    if (st == VLMD_OK && id < 0)
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s has no <|im_end|> to end an answer", path);
    *end = (uint32_t)id;
    vlmd_tokenizer_free(tok);
    return st;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *schema = NULL;
    vlmd_config cfg; /* --device and --cuda-* */
    vlmd_config_init_defaults(&cfg);
    long long prompt = 512, gen = 256, batch = 1, threads = 0;
    double bandwidth_gbs = 0, gemm_tflops = 0;
    bool eager = false;
    for (int i = 1; i < argc; i++) {
        if (vlmd_backend_tool_flag(&cfg, argc, argv, &i))
            continue;
        else if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 1 << 20, &prompt);
        else if (strcmp(argv[i], "--gen") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 1 << 20, &gen);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 4096, &batch);
        else if (strcmp(argv[i], "--bandwidth-gbs") == 0 && i + 1 < argc)
            vlmd_parse_double(argv[++i], 0, 1e6, &bandwidth_gbs);
        else if (strcmp(argv[i], "--gemm-tflops") == 0 && i + 1 < argc)
            vlmd_parse_double(argv[++i], 0, 1e6, &gemm_tflops);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 0, 4096, &threads);
        else if (strcmp(argv[i], "--enforce-eager") == 0)
            eager = true;
        else if (strcmp(argv[i], "--schema") == 0 && i + 1 < argc)
            schema = argv[++i];
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else {
            fprintf(stderr, "usage: vlmd-bench-engine MODEL_DIR [--device auto|cpu|cuda] [--cuda-* as vlmd-llm] "
                            "[--prompt N] [--gen N] [--batch B] [--bandwidth-gbs X] "
                            "[--gemm-tflops Y] [--threads N] [--enforce-eager] [--schema FILE|json_object]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: vlmd-bench-engine MODEL_DIR [flags]\n");
        return 2;
    }
    vlmd_error err = {0};
    bench_text_model t;
    const vlmd_backend_options opts = vlmd_backend_options_of(&cfg);
    if (bench_text_model_load(dir, &opts, &t, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-engine: %s\n", err.msg);
        return 1;
    }
    if (vlmd_backend_set_threads(t.backend, (int)threads, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-engine: --threads: %s\n", err.msg);
        return 1;
    }
    const vlmd_model_config mc = t.mc;
    vlmd_vocab *vocab = NULL;
    uint32_t end_id = 0;
    vlmd_buf text = {0};
    vlmd_request_grammar grammar = {VLMD_GRAMMAR_NONE, NULL, 0, -1, -1};
    if (schema) {
        bool object = strcmp(schema, "json_object") == 0;
        if (load_vocab(dir, &vocab, &end_id, &err) != VLMD_OK ||
            (!object && vlmd_read_file(schema, VLMD_GRAMMAR_MAX_SCHEMA_BYTES, &text, &err) != VLMD_OK)) {
            fprintf(stderr, "vlmd-bench-engine: %s\n", err.msg);
            return 1;
        }
        grammar = (vlmd_request_grammar){object ? VLMD_GRAMMAR_JSON_OBJECT : VLMD_GRAMMAR_JSON_SCHEMA,
                                         object ? "" : text.data, object ? 0 : (uint32_t)text.len,
                                         -1, -1};
    }
    engine_config ec = {.kv_slots = (int32_t)(batch * (prompt + gen) + 16),
                        .max_batch_tokens = (int32_t)(prompt * batch > 8192 ? 8192 : prompt * batch),
                        .max_running = (int32_t)batch, .eos_id = -1,
                        .max_model_len = (int32_t)(prompt + gen),
                        .decode_graphs = !eager && vlmd_backend_graphs_native(t.backend),
                        .vocab = vocab};
    if (ec.max_batch_tokens < prompt)
        ec.max_batch_tokens = (int32_t)prompt;
    engine *e = NULL;
    if (engine_create(t.model, &ec, on_emit, NULL, &e, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-engine: %s\n", err.msg);
        return 1;
    }
    uint32_t *ids = malloc((size_t)prompt * sizeof *ids);
    uint64_t rng = 42;
    for (long long r = 0; r < batch; r++) {
        bench_random_ids(&rng, ids, prompt, (uint32_t)mc.text.vocab_size);
        vlmd_msg_request_submit req = {.req_id = (uint64_t)r + 1, .tokens = ids,
                                       .n_tokens = (uint32_t)prompt, .max_tokens = (uint32_t)gen,
                                       .sampling = {.top_p = 1, .top_k = -1,
                                                    .repetition_penalty = 1},
                                       .stop_tokens = &end_id, .n_stop_tokens = schema ? 1 : 0,
                                       .grammar = grammar};
        if (engine_submit(e, &req, &err) != VLMD_OK) {
            fprintf(stderr, "vlmd-bench-engine: %s\n", err.msg);
            return 1;
        }
    }
    /* the steps that take prompts; then pure decode steps */
    uint64_t tp = vlmd_now_ns();
    long long steps = 0, prefill_steps = (prompt * batch + ec.max_batch_tokens - 1) / ec.max_batch_tokens;
    bool worked = true;
    for (; steps < prefill_steps && worked; steps++)
        engine_step(e, &worked, &err);
    uint64_t td = vlmd_now_ns();
    long long decode_steps = 0, emitted_before = emitted;
    while (finished < batch && worked) {
        if (engine_step(e, &worked, &err) != VLMD_OK) {
            fprintf(stderr, "vlmd-bench-engine: %s\n", err.msg);
            return 1;
        }
        decode_steps++;
    }
    uint64_t tend = vlmd_now_ns();
    double prefill_s = (double)(td - tp) / 1e9, decode_s = (double)(tend - td) / 1e9;
    double decode_tok = (double)(emitted - emitted_before);
    printf("model %s on %s: %.2f GB of weights, loaded in %.1f s\n", mc.architecture,
           vlmd_backend_info(t.backend)->name, (double)t.weight_bytes / 1e9, t.load_s);
    printf("batch %lld, prompt %lld, gen %lld: prefill %.3f s (%.0f tokens/s)", batch, prompt, gen,
           prefill_s, (double)(prompt * batch) / prefill_s);
    if (decode_steps)
        printf("; decode %lld steps %.3f s: %.2f ms/step, %.1f tokens/s", decode_steps, decode_s,
               decode_s * 1e3 / (double)decode_steps, decode_tok / decode_s);
    printf("\n");
    printf("decode graphs: %d captured (up to %d sequences), %llu steps through them\n",
           engine_graph_count(e), engine_graph_max_batch(e),
           (unsigned long long)engine_graph_steps(e));
    int kernels = engine_graph_kernels(e, (int32_t)batch);
    if (kernels >= 0)
        printf("kernels a decode step of %lld sequences: %d (%.1f a layer over %d layers)\n",
               batch, kernels, (double)kernels / (double)mc.text.num_layers,
               (int)mc.text.num_layers);
    if (gemm_tflops > 0) {
        const vlmd_text_config *tc = &mc.text;
        double q = (double)(tc->num_heads * tc->head_dim), kv = (double)(tc->num_kv_heads * tc->head_dim);
        double h = (double)tc->hidden_size, inter = (double)tc->intermediate_size;
        double linear = (double)tc->num_layers * (h * q + 2 * h * kv + q * h + 3 * h * inter);
        double n = (double)prompt, flops = (double)batch * ((2 * linear * n) +
                                                           (double)tc->num_layers * 2 * n * n * q);
        double tflops = flops / prefill_s / 1e12;
        printf("prefill: %.1f TFLOP/s, %.1f%% of the %.0f TFLOP/s bf16 GEMM rate\n", tflops,
               100.0 * tflops / gemm_tflops, gemm_tflops);
    }
    if (bandwidth_gbs > 0 && decode_steps) {
        double floor_ms = (double)t.weight_bytes / (bandwidth_gbs * 1e9) * 1e3;
        printf("weight-streaming floor %.2f ms/step at %.0f GB/s: %.1f%% of the ceiling\n",
               floor_ms, bandwidth_gbs, 100.0 * floor_ms / (decode_s * 1e3 / (double)decode_steps));
    }
    if (schema)
        printf("constrained by %s: %lld tokens made in all\n", schema, emitted);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) /* the weights and the cache, plus what runs them */
        printf("peak RSS %.2f GiB: %.2fx the weights (%.2f GiB) plus the KV cache (%.2f GiB)\n",
               (double)ru.ru_maxrss / (1 << 20),
               (double)ru.ru_maxrss * 1024 / ((double)t.weight_bytes +
                                              (double)ec.kv_slots * lm_kv_bytes_per_token(t.model)),
               (double)t.weight_bytes / (1u << 30),
               (double)ec.kv_slots * lm_kv_bytes_per_token(t.model) / (1u << 30));
    engine_free(e);
    bench_text_model_free(&t);
    vlmd_vocab_free(vocab);
    vlmd_buf_free(&text);
    free(ids);
    return 0;
}
