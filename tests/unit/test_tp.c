/* test_tp.c - tensor parallelism on the CPU backend (issue 22): a fixture
 * model loaded as rank r of N (lm_load_rank) in N forked processes,
 * joined by the CPU communicator, gives the whole model's logits and greedy
 * tokens. Each rank runs the same scenario (decode graphs captured, a
 * packed prefill of two prompts, then greedy decode steps of both, the
 * decode steps through the graphs); rank 0 writes its logits and tokens into
 * memory shared with the parent, which runs the scenario on the world-1
 * model in-process and compares: logits within 1e-4 relative (the largest
 * difference seen is logged), tokens equal. Every child exits with a status;
 * the parent waits with a deadline and kills a hang; the communicator's
 * directory under /dev/shm must be empty after each group. Also the
 * refusals: heads, MLP width or experts not a multiple of N, a communicator
 * that is not the rank's. Mixture-of-experts models split their experts by
 * rank (Qwen3-MoE at N = 2 and 4). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "comm.h"
#include "lm.h"
#include "test_ranks.h"
#include "test_support.h"

#define MAX_RANKS 4
#define STEPS 4                     /* greedy decode steps after the prefill */
#define N_SEQS 2
#define ROWS (N_SEQS * (1 + STEPS)) /* logit rows a scenario reports */
#define MAX_VOCAB 2048
#define WAIT_S 90                   /* the parent's bound on a group */
#define TOLERANCE 1e-4

/* What the ranks and the parent share (one anonymous shared mapping). */
typedef struct shared {
    char msg[MAX_RANKS][1200];      /* why a rank failed */
    int32_t tokens[ROWS];           /* rank 0's greedy tokens */
    float logits[ROWS][MAX_VOCAB];  /* rank 0's logits, row after row */
} shared;

/* ---- models: the fixtures, and one made here ----------------------------------------- */

/* A Qwen2 of 12 heads over 4 KV heads (groups of 3) with random weights:
 * over 3 ranks each rank's 4 query heads read KV heads 0,0,0,1 / 1,1,2,2 /
 * 2,3,3,3, which no split of the KV heads gives, so each rank keeps one per
 * query head; and a vocabulary of 1030, which 3 does not divide, so its tied
 * embedding (and lm_head) is every rank's whole. No fixture has such counts.
 * Built in the parent before the ranks fork (they inherit it). */
#define SYNTH "synthetic-gqa"
static const char synth_config[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
    "\"hidden_size\": 96, \"intermediate_size\": 48, \"num_attention_heads\": 12, "
    "\"num_key_value_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 1030, "
    "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, "
    "\"tie_word_embeddings\": true, \"hidden_act\": \"silu\"}";
static struct {
    unsigned char *data;
    size_t len;
} synth;

static float synth_value(uint64_t k)
{
    k = (k + 1) * 0x9e3779b97f4a7c15ull;
    k ^= k >> 31;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 29;
    return (float)(k & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
}

/* The synthetic checkpoint as a safetensors image in synth. */
static void synth_build(void)
{
    enum { H = 96, I = 48, Q = 96, KV = 32, V = 1030, L = 2, MAX_T = 4 + 11 * L };
    struct { char name[96]; int64_t r, c; float scale, bias; } t[MAX_T];
    int n = 0;
#define T(r_, c_, scale_, bias_, ...)                                                         \
    (snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__), t[n].r = r_, t[n].c = c_,            \
     t[n].scale = scale_, t[n].bias = bias_, n++)
    T(V, H, 1.0f, 0, "model.embed_tokens.weight");
    T(H, 0, 0.1f, 1, "model.norm.weight");
    for (int l = 0; l < L; l++) {
        T(H, 0, 0.1f, 1, "model.layers.%d.input_layernorm.weight", l);
        T(H, 0, 0.1f, 1, "model.layers.%d.post_attention_layernorm.weight", l);
        T(Q, H, 0.15f, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        T(Q, 0, 0.1f, 0, "model.layers.%d.self_attn.q_proj.bias", l);
        T(KV, H, 0.15f, 0, "model.layers.%d.self_attn.k_proj.weight", l);
        T(KV, 0, 0.1f, 0, "model.layers.%d.self_attn.k_proj.bias", l);
        T(KV, H, 0.15f, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        T(KV, 0, 0.1f, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        T(H, Q, 0.1f, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        T(I, H, 0.15f, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        T(I, H, 0.15f, 0, "model.layers.%d.mlp.up_proj.weight", l);
        T(H, I, 0.15f, 0, "model.layers.%d.mlp.down_proj.weight", l);
    }
#undef T
    cr_assert_leq(n, MAX_T);
    char header[16384];
    size_t at = 0, hl = 0, floats = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{");
    for (int i = 0; i < n; i++) {
        size_t count = (size_t)(t[i].r * (t[i].c ? t[i].c : 1));
        if (t[i].c)
            hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s\"%s\": {\"dtype\": "
                                   "\"F32\", \"shape\": [%lld, %lld], \"data_offsets\": "
                                   "[%zu, %zu]}", i ? ", " : "", t[i].name, (long long)t[i].r,
                                   (long long)t[i].c, at, at + count * 4);
        else
            hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s\"%s\": {\"dtype\": "
                                   "\"F32\", \"shape\": [%lld], \"data_offsets\": "
                                   "[%zu, %zu]}", i ? ", " : "", t[i].name, (long long)t[i].r,
                                   at, at + count * 4);
        at += count * 4;
        floats += count;
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    cr_assert_lt(hl + 8, sizeof header);
    while (hl % 8)
        header[hl++] = ' ';
    synth.len = 8 + hl + at;
    synth.data = malloc(synth.len);
    cr_assert_not_null(synth.data);
    uint64_t len = hl;
    memcpy(synth.data, &len, 8); /* little-endian, as x86-64 is */
    memcpy(synth.data + 8, header, hl);
    float *f = (float *)(void *)(synth.data + 8 + hl);
    for (int i = 0, k = 0; i < n; i++)
        for (int64_t j = 0; j < t[i].r * (t[i].c ? t[i].c : 1); j++, k++)
            f[k] = t[i].bias + t[i].scale * synth_value((uint64_t)k);
    (void)floats;
}

/* Opens `model`'s config and weights: a fixture ("name" for its
 * model.safetensors, "name:file" for another of its checkpoints), or SYNTH. */
static vlmd_status open_model(const char *model, vlmd_model_config *mc, vlmd_safetensors **st,
                              vlmd_error *err)
{
    if (strcmp(model, SYNTH) == 0) {
        if (!synth.data)
            synth_build();
        vlmd_status s = vlmd_model_config_parse(synth_config, SYNTH "/config.json", mc, err);
        return s != VLMD_OK ? s : vlmd_safetensors_open_memory(synth.data, synth.len, st, err);
    }
    char name[64];
    const char *colon = strchr(model, ':');
    snprintf(name, sizeof name, "%.*s", colon ? (int)(colon - model) : (int)strlen(model), model);
    vlmd_status s = vlmd_model_config_load(test_fixture(name), mc, err);
    return s != VLMD_OK ? s
                        : vlmd_safetensors_open_file(
                              test_model_file(name, colon ? colon + 1 : "model.safetensors"), st,
                              err);
}

/* ---- the scenario ------------------------------------------------------------------- */

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        best = x[i] > x[best] ? i : best;
    return best;
}

/* Runs the scenario on m: logits [ROWS][vocab], tokens [ROWS] (the argmax
 * of each row). Returns the first failure. */
static vlmd_status run_scenario(lm_model *m, float *logits, int32_t *tokens, vlmd_error *err)
{
    static const int32_t prompts[N_SEQS][7] = {{11, 250, 7, 901, 33, 4, 512},
                                               {600, 3, 77, 140, 9, 0, 0}};
    static const int32_t lens[N_SEQS] = {7, 5};
    const int V = (int)lm_vocab_size(m), MAX_KV = 32;
    lm_kv *kv = NULL;
    lm_workspace *ws = NULL;
    /* a hybrid model's state slots, a sequence each: 0 and 1 for the prefill, then copied
     * (lm_state_copy, which every rank mirrors) to 2 and 3 for the decode steps */
    int32_t state_slots[N_SEQS] = {0, 1};
    vlmd_status s = lm_kv_create_hybrid(m, N_SEQS * MAX_KV, 2 * N_SEQS, &kv, err);
    if (s == VLMD_OK)
        s = lm_workspace_create(m, 16, N_SEQS, MAX_KV, &ws, err);
    if (s == VLMD_OK)
        s = lm_capture_decode(m, kv, ws, err);
    int32_t slots[N_SEQS][32], len[N_SEQS] = {0};
    for (int q = 0; q < N_SEQS; q++)
        for (int i = 0; i < MAX_KV; i++)
            slots[q][i] = q * MAX_KV + i;
    int32_t ids[16], pos[3][16], step_slots[16], rows[N_SEQS];
    vlmd_attn_seq seqs[N_SEQS];
    float *out = malloc((size_t)N_SEQS * V * sizeof *out);
    if (!out && s == VLMD_OK)
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    for (int step = 0; s == VLMD_OK && step <= STEPS; step++) {
        int n = 0;
        for (int q = 0; q < N_SEQS; q++) {
            int k = step ? 1 : lens[q];
            seqs[q] = (vlmd_attn_seq){n, k, len[q] + k, slots[q]};
            for (int i = 0; i < k; i++, n++) {
                ids[n] = step ? tokens[(step - 1) * N_SEQS + q] : prompts[q][i] % V;
                pos[0][n] = pos[1][n] = pos[2][n] = len[q] + i;
                step_slots[n] = slots[q][len[q] + i];
            }
            len[q] += k;
            rows[q] = n - 1;
        }
        int32_t positions[3 * 16]; /* [3][n] */
        for (int r = 0; r < 3; r++)
            memcpy(positions + r * n, pos[r], (size_t)n * sizeof *positions);
        lm_batch bt = {n,    ids,    positions, step_slots, seqs, N_SEQS, rows, N_SEQS,
                       NULL, 0,      state_slots};
        if ((s = lm_forward(m, kv, ws, &bt, out, err)) != VLMD_OK)
            break;
        for (int q = 0; q < N_SEQS && step == 0 && lm_is_hybrid(m) && s == VLMD_OK; q++) {
            s = lm_state_copy(m, kv, q, N_SEQS + q, err);
            state_slots[q] = N_SEQS + q;
        }
        for (int q = 0; q < N_SEQS; q++) {
            int row = step * N_SEQS + q;
            memcpy(logits + (size_t)row * V, out + (size_t)q * V, (size_t)V * sizeof *out);
            tokens[row] = argmax(out + (size_t)q * V, V);
        }
    }
    if (s == VLMD_OK && lm_decode_graph_steps(ws) != STEPS)
        s = vlmd_errorf(err, VLMD_ERR_INTERNAL, "%llu of %d decode steps ran through a graph",
                        (unsigned long long)lm_decode_graph_steps(ws), STEPS);
    free(out);
    lm_workspace_free(m, ws);
    lm_kv_free(m, kv);
    return s;
}

/* ---- ranks --------------------------------------------------------------------------- */

/* One rank's life: open the CPU backend, join, load its share, run the
 * scenario; rank 0 reports. Exit 0, or a code per stage (sh->msg says why). */
static void rank_main(const char *model, const vlmd_comm_id *id, int world, int rank,
                      shared *sh)
{
    vlmd_backend *b = NULL;
    vlmd_comm *c = NULL;
    lm_model *m = NULL;
    vlmd_safetensors *st = NULL;
    vlmd_model_config mc;
    vlmd_error err = {0};
    int code = 0;
    static float logits[ROWS][MAX_VOCAB];
    static int32_t tokens[ROWS];
    vlmd_comm_options o = {.rank = rank, .world = world, .timeout_ms = 30000};
    if (vlmd_backend_create("cpu", &b, &err) != VLMD_OK)
        code = 11;
    else if (vlmd_backend_set_threads(b, 1, &err), vlmd_comm_create(b, id, &o, &c, &err) != VLMD_OK)
        code = 12;
    else if (open_model(model, &mc, &st, &err) != VLMD_OK)
        code = 13;
    else if (lm_load_rank(b, &mc, st, &(lm_parallel){rank, world, c}, &m, &err) !=
             VLMD_OK)
        code = 14;
    else if (run_scenario(m, &logits[0][0], tokens, &err) != VLMD_OK)
        code = 15;
    if (code)
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "stage %d: %s", code, err.msg);
    else if (rank == 0) {
        memcpy(sh->tokens, tokens, sizeof tokens);
        int V = (int)lm_vocab_size(m);
        for (int r = 0; r < ROWS; r++) /* the scenario packs rows V apart */
            memcpy(sh->logits[r], &logits[0][0] + (size_t)r * V, (size_t)V * sizeof(float));
    }
    lm_free(m);
    vlmd_safetensors_close(st);
    vlmd_comm_destroy(c);
    vlmd_backend_destroy(b);
    _exit(code);
}

/* Runs `model` as `world` ranks; every rank must exit 0. sh: what rank 0 reported. */
static void run_group(const char *model, int world, shared *sh)
{
    char dir[64];
    vlmd_comm_id id;
    test_group_id("tp-test", &dir, &id);
    pid_t pids[MAX_RANKS] = {0};
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0, "fork: %s", strerror(errno));
        if (pids[r] == 0)
            rank_main(model, &id, world, r, sh);
    }
    int codes[MAX_RANKS];
    test_wait_group(pids, world, WAIT_S, codes);
    int removed = rmdir(dir);
    cr_expect_eq(removed, 0, "%s is not empty after the group: %s", dir, strerror(errno));
    for (int r = 0; r < world; r++)
        cr_assert_eq(codes[r], 0, "%s rank %d of %d exited %d: %s", model, r, world, codes[r],
                     sh->msg[r]);
}

/* The world-1 model's scenario, in this process. */
static void run_whole(const char *model, float *logits, int32_t *tokens, int *vocab)
{
    vlmd_backend *b = NULL;
    vlmd_safetensors *st = NULL;
    vlmd_model_config mc;
    lm_model *m = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(open_model(model, &mc, &st, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_load(b, &mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    *vocab = (int)lm_vocab_size(m);
    cr_assert_leq(*vocab, MAX_VOCAB);
    cr_assert_eq(run_scenario(m, logits, tokens, &err), VLMD_OK, "%s", err.msg);
    lm_free(m);
    vlmd_safetensors_close(st);
    vlmd_backend_destroy(b);
}

/* `model` over `world` ranks gives the whole model's logits (within tol of
 * a row's largest) and tokens. */
static void expect_same_as_whole_within(const char *model, int world, double tol)
{
    static float whole[ROWS * MAX_VOCAB];
    int32_t whole_tokens[ROWS];
    int V = 0;
    run_whole(model, whole, whole_tokens, &V);
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                      0);
    cr_assert_neq(sh, MAP_FAILED);
    run_group(model, world, sh);
    double worst = 0;
    int bad = 0;
    for (int r = 0; r < ROWS; r++) {
        float scale = 0;
        for (int i = 0; i < V; i++)
            scale = fmaxf(scale, fabsf(whole[r * V + i]));
        for (int i = 0; i < V; i++) {
            double d = fabs((double)sh->logits[r][i] - whole[r * V + i]) / fmax(scale, 1e-6);
            if (d > worst)
                worst = d;
            if (!(d <= tol) && bad++ < 5)
                cr_log_error("%s N=%d row %d logit %d: %g, whole model %g", model, world, r, i,
                             sh->logits[r][i], whole[r * V + i]);
        }
        cr_expect_eq(sh->tokens[r], whole_tokens[r], "%s N=%d row %d: token %d, whole model %d",
                     model, world, r, sh->tokens[r], whole_tokens[r]);
    }
    cr_log_info("%s N=%d: largest logit difference %.3g of the row's largest logit", model,
                world, worst);
    fprintf(stderr, "test_tp: %s N=%d: max relative logit difference %.3g\n", model, world,
            worst);
    cr_expect_leq(worst, tol, "%s N=%d: logits differ by %g relative", model, world, worst);
    munmap(sh, sizeof *sh);
}

static void expect_same_as_whole(const char *model, int world)
{
    expect_same_as_whole_within(model, world, TOLERANCE);
}

Test(tp, qwen2_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen2", 2);
}

Test(tp, qwen2_vl_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen2_vl", 2);
}

Test(tp, qwen2_5_vl_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen2_5_vl", 2);
}

/* BF16 weights stay BF16 on the CPU: the slices are copied as they are. */
Test(tp, qwen2_bf16_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen2:model.bf16.safetensors", 2);
}

/* 4 ranks of the 4-head Qwen2 over 2 KV heads: one query head each, the KV
 * heads replicated (ranks 0 and 1 keep KV head 0, ranks 2 and 3 KV head 1). */
Test(tp, qwen2_four_ranks_replicated_kv_heads, .timeout = 120)
{
    expect_same_as_whole("qwen2", 4);
}

/* Qwen3 (q/k norm, one weight for every head): 6 heads over 2 KV heads split
 * in two; 1040 words split in two. N=3 is refused (intermediate 256). */
Test(tp, qwen3_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen3", 2);
}

/* Qwen3-VL's text path (interleaved M-RoPE; text rows only, no DeepStack). */
Test(tp, qwen3_vl_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen3_vl", 2);
}

/* Expert parallelism: each rank holds 4 (then 2) of the 8 experts, the
 * router replicated; layer 0 is dense (mlp_only_layers), split by columns. */
Test(tp, qwen3_moe_two_and_four_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen3_moe", 2);
    expect_same_as_whole("qwen3_moe", 4);
}

/* GLM-4.5: the dense first layer split by columns, the experts by rank,
 * the router and its correction bias every rank's, the shared expert split
 * like a dense MLP (its partial sum added to the experts' before the one
 * all-reduce); partial rotary on each rank's heads. */
Test(tp, glm4_moe_two_and_four_ranks, .timeout = 120)
{
    expect_same_as_whole("glm4_moe", 2);
    expect_same_as_whole("glm4_moe", 4);
}

/* Mixtral: every layer's 8 experts split by rank, no dense layer. */
Test(tp, mixtral_two_and_four_ranks, .timeout = 120)
{
    expect_same_as_whole("mixtral", 2);
    expect_same_as_whole("mixtral", 4);
}

/* Quantized checkpoints as published: each rank's rows and columns of the
 * codes with their scales (and zero points). The dense MLP's width (320 in
 * the FP8 fixtures, 384 in the 4-bit ones) is not two whole groups of 128
 * columns a rank: it is split on groups (256 + 64, 256 + 128) rather than
 * cut inside one; the experts by rank. Their other tensors are 16-bit, so
 * is the CPU's KV cache, which rounds the ranks' sums (added in another
 * order than one rank's) to bf16 or f16: measured 4e-7 to 2.6e-4 of a row's
 * largest logit, the greedy tokens equal. */
#define QUANT_TP_TOLERANCE 1e-3
Test(tp, quantized_checkpoints_two_ranks, .timeout = 120)
{
    static const char *const models[] = {
        "quant/qwen3_fp8_block",  "quant/qwen3_moe_fp8_block_bf16scale",
        "quant/qwen3_fp8_channel_ct", "quant/qwen3_awq", "quant/qwen3_gptq_v2",
        "quant/qwen3_moe_gptq",   "quant/qwen3_w4a16_ct",
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        expect_same_as_whole_within(models[i], 2, QUANT_TP_TOLERANCE);
}

/* Qwen3.5: each rank its share of the linear attention's key and value heads
 * (the MoE's 2 key heads over 4 value heads: a key head and its two value
 * heads a rank), their rows of every projection and of the conv, their
 * columns of out_proj, their slots' states; the gated attention by heads. */
Test(tp, qwen3_5_two_ranks, .timeout = 120)
{
    expect_same_as_whole("qwen3_5", 2);
    expect_same_as_whole("qwen3_5_moe", 2);
}

/* 12 heads over 4 KV heads in 3 ranks: KV heads repeated per query head. */
Test(tp, synthetic_three_ranks_repeated_kv_heads, .timeout = 120)
{
    expect_same_as_whole(SYNTH, 3);
}

/* ---- refusals ------------------------------------------------------------------------ */

/* lm_load_rank of `model` as rank 0 of `world` with communicator c:
 * refused with `status`; the message is returned (static). */
static const char *refusal(const char *model, int world, vlmd_comm *c, vlmd_status status)
{
    static vlmd_error err;
    vlmd_backend *b = NULL;
    vlmd_safetensors *st = NULL;
    vlmd_model_config mc;
    lm_model *m = NULL;
    memset(&err, 0, sizeof err);
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(open_model(model, &mc, &st, &err), VLMD_OK, "%s", err.msg);
    uint64_t before = vlmd_backend_alloc_count(b);
    vlmd_status s = lm_load_rank(b, &mc, st, &(lm_parallel){0, world, c}, &m, &err);
    cr_expect_eq(s, status, "%s N=%d: %s (%s)", model, world, vlmd_status_str(s), err.msg);
    cr_expect_null(m);
    cr_expect_eq(vlmd_backend_alloc_count(b), before, "a refusal allocates nothing");
    lm_free(m);
    vlmd_safetensors_close(st);
    vlmd_backend_destroy(b);
    return err.msg;
}

/* A communicator of one rank (world 1) joined in this process, standing in
 * for a group's: the checks before it is used. */
static vlmd_comm *lone_comm(vlmd_backend **b, char (*dir)[64])
{
    vlmd_comm_id id;
    test_group_id("tp-test", dir, &id);
    vlmd_comm *c = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", b, &err), VLMD_OK, "%s", err.msg);
    vlmd_comm_options o = {.rank = 0, .world = 1, .timeout_ms = 5000};
    cr_assert_eq(vlmd_comm_create(*b, &id, &o, &c, &err), VLMD_OK, "%s", err.msg);
    return c;
}

/* Every rank of a real group of `world` (forked) is refused loading
 * `model` with VLMD_ERR_INVALID_ARG and a message containing `want`. */
static void refuse_in_group(const char *model, int world, const char *want)
{
    char dir[64];
    vlmd_comm_id id;
    vlmd_error err = {0};
    test_group_id("tp-test", &dir, &id);
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                      0);
    cr_assert_neq(sh, MAP_FAILED);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0);
        if (pids[r])
            continue;
        vlmd_backend *b = NULL;
        vlmd_comm *c = NULL;
        vlmd_safetensors *st = NULL;
        vlmd_model_config mc;
        lm_model *m = NULL;
        vlmd_comm_options o = {.rank = r, .world = world, .timeout_ms = 30000};
        int code = 1;
        if (vlmd_backend_create("cpu", &b, &err) == VLMD_OK &&
            vlmd_comm_create(b, &id, &o, &c, &err) == VLMD_OK &&
            open_model(model, &mc, &st, &err) == VLMD_OK) {
            vlmd_status s = lm_load_rank(b, &mc, st, &(lm_parallel){r, world, c}, &m,
                                            &err);
            code = s == VLMD_ERR_INVALID_ARG && !m ? 0 : 2;
        }
        snprintf(sh->msg[r], sizeof sh->msg[r], "%s", err.msg);
        lm_free(m);
        vlmd_safetensors_close(st);
        vlmd_comm_destroy(c);
        vlmd_backend_destroy(b);
        _exit(code);
    }
    int codes[MAX_RANKS];
    test_wait_group(pids, world, WAIT_S, codes);
    for (int r = 0; r < world; r++) {
        cr_expect_eq(codes[r], 0, "%s rank %d of %d was not refused: %s", model, r, world,
                     sh->msg[r]);
        cr_expect(strstr(sh->msg[r], want), "%s rank %d of %d: \"%s\" lacks \"%s\"", model, r,
                  world, sh->msg[r], want);
    }
    cr_log_info("%s N=%d refused: %s", model, world, sh->msg[0]);
    cr_expect_eq(rmdir(dir), 0, "%s is not empty after the group", dir);
    munmap(sh, sizeof *sh);
}

Test(tp, qwen2_three_ranks_refused_naming_the_counts, .timeout = 120)
{
    refuse_in_group("qwen2", 3, "num_attention_heads 4 and intermediate_size 256 must both be "
                                "multiples of the tensor-parallel size 3");
    refuse_in_group("qwen2_vl", 3, "tensor-parallel size 3");
    refuse_in_group("qwen2_5_vl", 3, "tensor-parallel size 3");
    refuse_in_group("qwen3", 3, "num_attention_heads 6 and intermediate_size 256 must both be "
                                "multiples of the tensor-parallel size 3");
}

/* Four ranks of the quantized fixtures: the dense MLP's 320 or 384 columns
 * are three groups of 128, one too few for a share each. */
Test(tp, a_split_that_would_cut_quantized_groups_is_refused_with_the_numbers, .timeout = 120)
{
    refuse_in_group("quant/qwen3_fp8_block", 4, "a SwiGLU width of 320 is 3 groups of 128 "
                                                "quantized columns, too few for a share on each "
                                                "of 4 ranks");
    refuse_in_group("quant/qwen3_awq", 4, "a SwiGLU width of 384 is 3 groups of 128");
}

Test(tp, moe_experts_not_a_multiple_refused, .timeout = 120)
{
    refuse_in_group("qwen3_moe", 3, "its 8 experts must be a multiple of the tensor-parallel "
                                    "size 3");
}

Test(tp, a_communicator_of_another_world_is_refused)
{
    vlmd_backend *b;
    char dir[64];
    vlmd_comm *c = lone_comm(&b, &dir);
    const char *msg = refusal("qwen2", 2, c, VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(msg, "rank 0 of 2") && strstr(msg, "another rank or world"), "%s", msg);
    msg = refusal("qwen2", 2, NULL, VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(msg, "given: none"), "%s", msg);
    vlmd_comm_destroy(c);
    vlmd_backend_destroy(b);
    cr_expect_eq(rmdir(dir), 0);
}
