/* test_lm.c - the Qwen2 and Qwen3 text forward on the CPU backend
 * against the fixtures (Qwen2 family: computed by Hugging Face transformers;
 * Qwen3, Qwen3-MoE, Qwen3-VL: by the validated port, see their README):
 * logits at every prompt position within 1e-4 relative error with F32
 * weights, and the 12-token greedy continuation identical. With BF16
 * weights the logits are compared to the same F32 reference (there is no
 * BF16 one): rounding the weights alone moves them by 0.65e-2 to 1.16e-2
 * (measured; the widening is exact and the F32 path is within 1e-4), so the
 * bound there is 2e-2 (where the CPU's kernels also round the activations
 * to bf16, as the AVX-512 BF16 ones do, every BF16 bound is at least the
 * CUDA backend's 2e-2). Qwen3-MoE with BF16 weights is compared with the
 * F32 model's expert choices (see the tape below): its own choices differ
 * where bf16 rounding reorders two router logits, which moves its logits
 * by 2.7e-2 to 6.3e-2 (measured; the fixture README says 3e-2 to 6e-2), and
 * with the F32 choices 0.9e-2 to 1.01e-2, as the dense models. The image
 * cases take the reference vision embeddings at their pad tokens and,
 * Qwen3-VL's, each DeepStack feature beside them, as the arena holds them. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "cpu_kernels.h"
#include "kv_calibration.h"
#include "lm.h"
#include "tokenizer.h"
#include "test_support.h"

/* ---- replaying one model's expert choices in another ------------------------------ */

/* moe_route taped: the router model, F32 on a CPU backend of its own,
 * records each call's expert ids; the model under test (any backend)
 * replays them, call for call, weighted by its own router's probabilities
 * of them. Ids, weights and logits move through the backend's copies, so
 * a device's ops are taped too. (Ops have no context pointer: one tape
 * per process.) */
static struct {
    vlmd_backend *rec_b, *play_b;
    const vlmd_op_table *rec_base, *play_base;
    vlmd_op_table rec_table, play_table;
    int32_t *ids;                   /* recorded, in call order */
    size_t len, cap, at;
    float *host;                    /* replay staging: logits, then weights */
    int32_t *host_ids;
} tape;

static void taped_route(vlmd_backend *b, int32_t *ids, float *weights, const void *logits,
                        int n, int n_experts, int k, const vlmd_moe_router *r, bool worst_case)
{
    bool rec = b == tape.rec_b;
    (rec ? tape.rec_base : tape.play_base)
        ->moe_route(b, ids, weights, logits, n, n_experts, k, r, worst_case);
    size_t count = (size_t)n * k;
    if (rec) {
        if (tape.len + count > tape.cap) {
            tape.cap = 2 * (tape.len + count);
            tape.ids = realloc(tape.ids, tape.cap * sizeof *tape.ids);
            cr_assert_not_null(tape.ids);
        }
        cr_assert_eq(vlmd_backend_copy_to_host(b, tape.ids + tape.len, ids,
                                               count * sizeof *ids, NULL), VLMD_OK);
        tape.len += count;
        return;
    }
    cr_assert_leq(tape.at + count, tape.len, "the replay follows the recording");
    tape.host = realloc(tape.host, (size_t)n * (n_experts + k) * sizeof *tape.host);
    tape.host_ids = realloc(tape.host_ids, count * sizeof *tape.host_ids);
    cr_assert(tape.host && tape.host_ids);
    float *row_w = tape.host + (size_t)n * n_experts;
    cr_assert_eq(vlmd_backend_download_f32(b, tape.host, logits, (size_t)n * n_experts, NULL),
                 VLMD_OK);
    for (int t = 0; t < n; t++) { /* the recorded choices weighted as r weighs its own */
        const float *row = tape.host + (size_t)t * n_experts;
        float mx = row[0], total = r->sigmoid ? 1e-20f : 0.0f;
        for (int e = 1; e < n_experts; e++)
            mx = row[e] > mx ? row[e] : mx;
        double sum = 0;
        for (int e = 0; e < n_experts; e++)
            sum += exp((double)(row[e] - mx));
        float *w = row_w + (size_t)t * k;
        for (int j = 0; j < k; j++) {
            int32_t id = tape.ids[tape.at++];
            tape.host_ids[(size_t)t * k + j] = id;
            w[j] = r->sigmoid ? 1.0f / (1.0f + expf(-row[id]))
                              : (float)(exp((double)(row[id] - mx)) / sum);
            total += w[j];
        }
        for (int j = 0; r->renormalize && j < k; j++)
            w[j] /= total;
        for (int j = 0; j < k; j++)
            w[j] *= r->scale;
    }
    cr_assert_eq(vlmd_backend_copy_to_device(b, ids, tape.host_ids, count * sizeof *ids, NULL),
                 VLMD_OK);
    cr_assert_eq(vlmd_backend_copy_to_device(b, weights, row_w, count * sizeof *weights, NULL),
                 VLMD_OK);
}

/* Models loaded on rec (a CPU backend) record; those on play replay. */
static void tape_install(vlmd_backend *rec, vlmd_backend *play)
{
    tape.rec_b = rec, tape.play_b = play;
    tape.rec_base = vlmd_backend_ops(rec), tape.play_base = vlmd_backend_ops(play);
    tape.rec_table = *tape.rec_base, tape.play_table = *tape.play_base;
    tape.rec_table.moe_route = tape.play_table.moe_route = taped_route;
    rec->op_table = &tape.rec_table;
    play->op_table = &tape.play_table;
}

static void tape_free(void)
{
    free(tape.ids);
    free(tape.host);
    free(tape.host_ids);
    memset(&tape, 0, sizeof tape);
}

/* ---- fixtures ---------------------------------------------------------------------- */

typedef struct fixture {
    vlmd_model_config mc;
    vlmd_backend *b;
    lm_model *m;
    vlmd_backend *router_b;     /* a CPU backend for the router model */
    lm_model *router;        /* whose expert choices m replays (NULL: its own) */
    vlmd_safetensors *ref;
    json_t *json;
} fixture;

static lm_model *load_model(vlmd_backend *b, const vlmd_model_config *mc, const char *model,
                               const char *weights)
{
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    lm_model *m = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, weights), &st, &err), VLMD_OK,
                 "%s", err.msg);
    cr_assert_eq(lm_load(b, mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st); /* the model holds its own copy */
    return m;
}

/* false when the device is not there (only "cuda" may be missing), or when
 * its ops cannot run the model yet: then its load must be refused, naming
 * what is missing. routing_from: the weights (on the CPU) whose expert
 * choices the model replays, or NULL. */
static bool open_fixture_with(fixture *f, const char *model, const char *weights,
                              const char *device, const char *routing_from, bool w8a8)
{
    memset(f, 0, sizeof *f);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &f->mc, &err), VLMD_OK, "%s", err.msg);
    f->mc.quant.fp8_activations = w8a8;
    if (!test_backend_open(device, &f->b))
        return false;
    if (lm_backend_check(f->b, &f->mc, &err) != VLMD_OK) {
        cr_assert_str_neq(device, "cpu", "%s", err.msg);
        vlmd_safetensors *st = NULL;
        lm_model *m = NULL;
        cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, weights), &st, NULL),
                     VLMD_OK);
        cr_expect_eq(lm_load(f->b, &f->mc, st, &m, &err), VLMD_ERR_UNAVAILABLE);
        cr_expect(strstr(err.msg, "(use --device cpu)") && strstr(err.msg, f->mc.architecture),
                  "%s", err.msg);
        /* said, not failed: a cr_log_warn makes the run exit 1 */
        fprintf(stderr, "%s on %s: %s\n", model, device, err.msg);
        vlmd_safetensors_close(st);
        vlmd_backend_destroy(f->b);
        return false;
    }
    if (routing_from) {
        cr_assert_eq(vlmd_backend_create("cpu", &f->router_b, NULL), VLMD_OK);
        tape_install(f->router_b, f->b);
        f->router = load_model(f->router_b, &f->mc, model, routing_from);
    }
    f->m = load_model(f->b, &f->mc, model, weights);
    f->ref = test_reference_tensors(model);
    f->json = test_reference_json(model);
    return true;
}

static bool open_fixture_routed(fixture *f, const char *model, const char *weights,
                                const char *device, const char *routing_from)
{
    return open_fixture_with(f, model, weights, device, routing_from, false);
}

static bool open_fixture_on(fixture *f, const char *model, const char *weights, const char *device)
{
    return open_fixture_routed(f, model, weights, device, NULL);
}

static void open_fixture(fixture *f, const char *model, const char *weights)
{
    open_fixture_on(f, model, weights, "cpu");
}

static void close_fixture(fixture *f)
{
    lm_free(f->m);
    lm_free(f->router);
    vlmd_safetensors_close(f->ref);
    vlmd_backend_destroy(f->b);
    vlmd_backend_destroy(f->router_b);
    json_decref(f->json);
    tape_free();
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* How the greedy continuation is held to the reference: token for token
 * (F32 weights), or so until a near tie, where the bf16 rounding may pick the
 * other token (the margin is reported, and the case ends there: what
 * follows continues a different text). */
typedef enum greedy_check { GREEDY_EXACT, GREEDY_UNTIL_NEAR_TIE } greedy_check;

/* A near tie: the two tokens' logits closer than 2% of the row's largest magnitude. */
static bool near_tie(const float *row, int V, int a, int b)
{
    float big = 0;
    for (int i = 0; i < V; i++)
        big = fabsf(row[i]) > big ? fabsf(row[i]) : big;
    return fabsf(row[a] - row[b]) <= 0.02f * big;
}

/* Every sequence of a test's step in state slot 0 (one at a time: a hybrid
 * model's state; ignored by the others). */
static const int32_t STATE_SLOTS[64] = {0};

/* A model and its cache and workspace; with a router model beside it, the
 * router's own. */
typedef struct runner {
    fixture *f;
    lm_kv *kv, *router_kv;
    lm_workspace *ws, *router_ws;
} runner;

static void runner_open(runner *r, fixture *f, int max)
{
    vlmd_error err = {0};
    *r = (runner){.f = f};
    /* (a hybrid model's sequences take state slot 0: STATE_SLOTS) */
    cr_assert_eq(lm_kv_create_hybrid(f->m, max, 1, &r->kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(f->m, max, max, max, &r->ws, &err), VLMD_OK, "%s",
                 err.msg);
    if (!f->router)
        return;
    cr_assert_eq(lm_kv_create(f->router, max, &r->router_kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(f->router, max, max, max, &r->router_ws, &err), VLMD_OK,
                 "%s", err.msg);
}

static void runner_close(runner *r)
{
    lm_workspace_free(r->f->m, r->ws);
    lm_kv_free(r->f->m, r->kv);
    if (r->f->router) {
        lm_workspace_free(r->f->router, r->router_ws);
        lm_kv_free(r->f->router, r->router_kv);
    }
}

/* One step of the model (the router model's first, its expert choices taped). */
static void runner_forward(runner *r, const lm_batch *bt, float *logits)
{
    vlmd_error err = {0};
    if (r->f->router) {
        tape.len = tape.at = 0;
        cr_assert_eq(lm_forward(r->f->router, r->router_kv, r->router_ws, bt, NULL, &err),
                     VLMD_OK, "%s", err.msg);
    }
    cr_assert_eq(lm_forward(r->f->m, r->kv, r->ws, bt, logits, &err), VLMD_OK, "%s", err.msg);
    if (r->f->router)
        cr_assert_eq(tape.at, tape.len, "every recorded choice replayed");
}

/* A case's images as the engine reads them from the arena: the reference
 * vision embeddings of all its images (one run of pads each, in prompt
 * order), then each DeepStack feature's rows (Qwen3-VL), in one buffer
 * (returned; the caller frees it, NULL for a text case) that runs[i] point
 * into. */
static float *image_rows(const fixture *f, size_t ci, const int32_t *ids, int n,
                         lm_embed_run *runs, int *n_runs)
{
    char name[64];
    snprintf(name, sizeof name, "case%zu.vision_embeds", ci);
    const vlmd_tensor_view *ve = vlmd_safetensors_find(f->ref, name);
    *n_runs = 0;
    if (!ve)
        return NULL;
    const size_t H = lm_hidden_size(f->m), T = (size_t)ve->shape[0];
    const int features = lm_deepstack_features(f->m);
    cr_assert_eq(ve->shape[1], (int64_t)H);
    float *buf = malloc((1 + (size_t)features) * T * H * sizeof *buf);
    cr_assert_not_null(buf);
    memcpy(buf, ve->data, T * H * sizeof *buf);
    for (int k = 0; k < features; k++) {
        snprintf(name, sizeof name, "case%zu.deepstack_%d", ci, k);
        const vlmd_tensor_view *ds = vlmd_safetensors_find(f->ref, name);
        cr_assert(ds && ds->shape[0] == (int64_t)T && ds->shape[1] == (int64_t)H, "%s", name);
        memcpy(buf + (1 + (size_t)k) * T * H, ds->data, T * H * sizeof *buf);
    }
    const int32_t pad = (int32_t)f->mc.image_token_id;
    size_t used = 0;
    for (int i = 0; i < n;) {
        if (ids[i] != pad) {
            i++;
            continue;
        }
        int start = i;
        while (i < n && ids[i] == pad)
            i++;
        cr_assert_lt(*n_runs, 4);
        runs[(*n_runs)++] = (lm_embed_run){start, i - start, buf + used * H, T * H};
        used += (size_t)(i - start);
    }
    cr_assert_eq(used, T, "case %zu: the pads run for the images' tokens", ci);
    return buf;
}

/* Case ci's ids and positions (pos [3][n]: the reference's M-RoPE rows where
 * it has them); returns n. */
static int case_inputs(const fixture *f, size_t ci, int max, int32_t *ids, int32_t *pos)
{
    json_t *ids_j = json_object_get(json_array_get(json_object_get(f->json, "cases"), ci),
                                    "input_ids");
    int n = (int)json_array_size(ids_j);
    cr_assert_leq(n, max);
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
        for (int r = 0; r < 3; r++)
            pos[r * n + i] = i;
    }
    char name[64];
    snprintf(name, sizeof name, "case%zu.position_ids", ci);
    const vlmd_tensor_view *pt = vlmd_safetensors_find(f->ref, name);
    if (pt) {
        cr_assert_eq(pt->shape[1], n);
        for (int i = 0; i < 3 * n; i++)
            pos[i] = (int32_t)((const int64_t *)pt->data)[i];
    }
    return n;
}

/* Case ci of f's reference (its ids and positions) through m in one step on a
 * cache of its own (a hybrid model's state in slot 0): its n x V logits (the
 * caller frees them). */
static float *case_logits(lm_model *m, const fixture *f, size_t ci, int *n_out)
{
    enum { MAX = 512 };
    static int32_t ids[MAX], pos[3 * MAX], slots[MAX], rows[MAX];
    int n = case_inputs(f, ci, MAX, ids, pos), V = (int)lm_vocab_size(m);
    for (int i = 0; i < n; i++)
        slots[i] = rows[i] = i;
    lm_kv *kv = NULL;
    lm_workspace *ws = NULL;
    vlmd_error err = {0};
    cr_assert_eq(lm_kv_create_hybrid(m, n, 1, &kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(m, n, n, n, &ws, &err), VLMD_OK, "%s", err.msg);
    float *logits = malloc((size_t)n * V * sizeof *logits);
    int32_t state = 0;
    vlmd_attn_seq seq = {0, n, n, slots};
    lm_batch bt = {n, ids, pos, slots, &seq, 1, rows, n, NULL, 0, &state};
    cr_assert_eq(lm_forward(m, kv, ws, &bt, logits, &err), VLMD_OK, "%s", err.msg);
    lm_workspace_free(m, ws);
    lm_kv_free(m, kv);
    *n_out = n;
    return logits;
}

/* What check_model runs: every case of a fixture model on a device. */
typedef struct model_check {
    const char *device, *model, *weights;
    double tol;
    greedy_check greedy;
    bool text_only;             /* only the cases without images */
    const char *routing_from;   /* MoE: the weights whose expert choices are replayed */
    bool w8a8;                  /* FP8 checkpoints with --fp8-activations on: against the
                                 * reference's logits_w8a8 and greedy_continuation_w8a8 (the
                                 * cases that have them) */
    int kv_fp8;                 /* an FP8 KV cache: KV_FP8_CHECKPOINT's scales, or
                                 * KV_FP8_MEASURED on vlmd's calibration text (0: none) */
} model_check;
enum { KV_FP8_CHECKPOINT = 1, KV_FP8_MEASURED };

/* Logits of bf16 weights and bf16 activations (each linear's input rounded)
 * against the F32 reference: the CUDA backend's (measured on the emulator,
 * below) and the CPU's with the AVX-512 BF16 kernels, whose products are
 * bf16 x bf16 (cpu_kernels_avx512bf16.c; measured 0.49e-2 (qwen3_vl) to
 * 1.46e-2 (qwen2_5_vl), against 0.41e-2 to 1.18e-2 with fp32 activations). */
#define BF16_ACTIVATIONS_TOL 2e-2

/* Whether the CPU backend rounds the activations of these weights to bf16:
 * BF16 weights on the AVX-512 BF16 kernels ($VLMD_CPU_ISA may cap them). */
static bool cpu_bf16_activations(const char *device, const char *weights)
{
    return strcmp(device, "cpu") == 0 && strstr(weights, "bf16") &&
           vlmd_cpu_kernels_best()->isa == VLMD_CPU_ISA_AVX512_BF16;
}

/* The fixture's KV cache in FP8 at its checkpoint's scales, from now on. */
static void fp8_kv_from_checkpoint(fixture *f, const char *model, const char *weights)
{
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    bool found = false;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, weights), &st, &err), VLMD_OK);
    cr_assert_eq(lm_kv_scales_read(f->m, st, &found, &err), VLMD_OK, "%s", err.msg);
    cr_assert(found, "%s has its KV scales", model);
    cr_assert_eq(vlmd_backend_set_kv_dtype(f->b, true, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
}

/* The fixture's KV cache in FP8 at scales measured on the calibration text
 * (through its tokenizer, as the worker does), from now on. */
static void fp8_kv_measured(fixture *f, const char *model)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", test_fixture(model));
    vlmd_tokenizer *tok = NULL;
    vlmd_tokens t = {0};
    vlmd_error err = {0};
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_tokenizer_encode(tok, kv_calibration_text, sizeof kv_calibration_text - 1,
                                       VLMD_SPECIAL_MATCH, &t), VLMD_OK);
    int32_t ids[512];
    int n = 0;
    for (size_t i = 0; i < t.n && n < 512; i++)
        ids[n++] = (int32_t)t.ids[i];
    cr_assert_eq(lm_kv_scales_measure(f->m, ids, n, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_set_kv_dtype(f->b, true, &err), VLMD_OK, "%s", err.msg);
    vlmd_tokens_free(&t);
    vlmd_tokenizer_free(tok);
}

/* Runs every case of a model: prefill logits, then greedy decoding. */
static void check_model_with(const model_check *mk)
{
    fixture f;
    if (!open_fixture_with(&f, mk->model, mk->weights, mk->device, mk->routing_from, mk->w8a8))
        return;
    const char *device = mk->device, *model = mk->model, *weights = mk->weights;
    const int V = (int)lm_vocab_size(f.m), max = 512;
    if (mk->kv_fp8 == KV_FP8_CHECKPOINT)
        fp8_kv_from_checkpoint(&f, model, weights);
    else if (mk->kv_fp8 == KV_FP8_MEASURED)
        fp8_kv_measured(&f, model);
    const double tol = cpu_bf16_activations(device, weights) && mk->tol < BF16_ACTIVATIONS_TOL
                           ? BF16_ACTIVATIONS_TOL
                           : mk->tol;
    runner run;
    runner_open(&run, &f, max);
    size_t ci;
    json_t *c;
    int checked = 0;
    json_array_foreach(json_object_get(f.json, "cases"), ci, c)
    {
        if (mk->text_only && (json_object_get(c, "image") || json_object_get(c, "images")))
            continue;
        const char *suffix = mk->w8a8 ? "_w8a8" : "";
        char key[64];
        snprintf(key, sizeof key, "case%zu.logits%s", ci, suffix);
        if (mk->w8a8 && !vlmd_safetensors_find(f.ref, key))
            continue; /* (the MoE fixture's W8A8 reference has case 0 alone) */
        json_t *ids_j = json_object_get(c, "input_ids");
        int n = (int)json_array_size(ids_j);
        cr_assert_lt(n + 12, max);
        int32_t *ids = calloc((size_t)max, sizeof *ids), *pos = calloc(3 * (size_t)max, sizeof *pos);
        int32_t *slots = calloc((size_t)max, sizeof *slots), *rows = calloc((size_t)max, sizeof *rows);
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
            slots[i] = i;
            rows[i] = i;
            for (int r = 0; r < 3; r++)
                pos[r * n + i] = i;
        }
        char name[64];
        snprintf(name, sizeof name, "case%zu.position_ids", ci);
        const vlmd_tensor_view *pt = vlmd_safetensors_find(f.ref, name);
        if (pt) { /* M-RoPE positions as the reference computed them */
            cr_assert_eq(pt->shape[1], n);
            const int64_t *p64 = pt->data;
            for (int i = 0; i < 3 * n; i++)
                pos[i] = (int32_t)p64[i];
        }
        /* an image case: its pad tokens take the reference vision embeddings */
        lm_embed_run images[4];
        int n_images = 0;
        float *arena = image_rows(&f, ci, ids, n, images, &n_images);
        float *logits = malloc((size_t)n * V * sizeof *logits);
        vlmd_attn_seq seq = {0, n, n, slots};
        lm_batch bt = {n, ids, pos, slots, &seq, 1, rows, n, images, n_images, STATE_SLOTS};
        runner_forward(&run, &bt, logits);
        free(arena);

        snprintf(name, sizeof name, "case%zu.logits%s", ci, suffix);
        const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, name);
        cr_assert_not_null(lt);
        cr_assert_eq(vlmd_tensor_numel(lt), (int64_t)n * V);
        const float *ref = lt->data;
        double rel = test_rel_error(logits, ref, (size_t)n * V);
        if (strcmp(device, "cpu") != 0 || mk->kv_fp8) /* the numbers the notes report */
            fprintf(stderr, "%s %s %s case %zu: logits relative error %.4g\n", device, model,
                    weights, ci, rel);
        cr_expect_lt(rel, tol, "%s %s case %zu: relative error %.3g", model, weights, ci, rel);
        if (mk->w8a8) { /* nearer the W8A8 reference than the weight-only one; greedy tokens
                         * are not held (see w8a8_checks) */
            snprintf(name, sizeof name, "case%zu.logits", ci);
            double w16 = test_rel_error(logits, vlmd_safetensors_find(f.ref, name)->data,
                                        (size_t)n * V);
            cr_expect_lt(rel, w16, "%s case %zu: %.3g from W8A8, %.3g from W8A16", model, ci,
                         rel, w16);
            checked++;
            free(ids), free(pos), free(slots), free(rows), free(logits);
            continue;
        }

        {
            snprintf(key, sizeof key, "greedy_continuation%s", suffix);
            json_t *want = json_object_get(c, key);
            const float *last = logits + (size_t)(n - 1) * V;
            int next = argmax(last, V);
            int32_t last_pos = 0;
            for (int i = 0; i < 3 * n; i++)
                last_pos = pos[i] > last_pos ? pos[i] : last_pos;
            for (size_t k = 0; k < json_array_size(want); k++) {
                int expected = (int)json_integer_value(json_array_get(want, k));
                if (next != expected && mk->greedy == GREEDY_UNTIL_NEAR_TIE) {
                    cr_expect(near_tie(last, V, next, expected), "%s %s case %zu: token %zu is "
                              "%d, not %d, and no near tie (margin %g)", device, model, ci, k,
                              next, expected, last[next] - last[expected]);
                    fprintf(stderr, "%s %s %s case %zu: near tie at greedy token %zu (%d over "
                            "%d by %g)\n", device, model, weights, ci, k, next, expected,
                            last[next] - last[expected]);
                    break;
                }
                cr_expect_eq(next, expected, "%s case %zu: greedy token %zu", model, ci, k);
                int32_t id = next, p[3], slot = n + (int32_t)k, row = 0;
                for (int r = 0; r < 3; r++)
                    p[r] = last_pos + 1 + (int32_t)k;
                slots[slot] = slot;
                vlmd_attn_seq one = {0, 1, slot + 1, slots};
                lm_batch step = {1, &id, p, &slot, &one, 1, &row, 1, NULL, 0, STATE_SLOTS};
                runner_forward(&run, &step, logits);
                last = logits;
                next = argmax(last, V);
            }
        }
        checked++;
        free(ids);
        free(pos);
        free(slots);
        free(rows);
        free(logits);
    }
    cr_expect_geq(checked, mk->w8a8 ? 1 : f.mc.has_vision && !mk->text_only ? 4 : 2,
                  "%s: every case ran", model);
    runner_close(&run);
    close_fixture(&f);
}

static void check_model_on(const char *device, const char *model, const char *weights, double tol,
                           greedy_check greedy)
{
    check_model_with(&(model_check){device, model, weights, tol, greedy, false, NULL});
}

static void check_model(const char *model, const char *weights, double tol, greedy_check greedy)
{
    check_model_on("cpu", model, weights, tol, greedy);
}

Test(lm, qwen2_f32) { check_model("qwen2", "model.safetensors", 1e-4, GREEDY_EXACT); }
Test(lm, qwen2_bf16)
{
    check_model("qwen2", "model.bf16.safetensors", 2e-2, GREEDY_UNTIL_NEAR_TIE);
}
Test(lm, qwen2_vl_text_f32) { check_model("qwen2_vl", "model.safetensors", 1e-4, GREEDY_EXACT); }
Test(lm, qwen2_vl_text_bf16)
{
    check_model("qwen2_vl", "model.bf16.safetensors", 2e-2, GREEDY_UNTIL_NEAR_TIE);
}
Test(lm, qwen2_5_vl_text_f32)
{
    check_model("qwen2_5_vl", "model.safetensors", 1e-4, GREEDY_EXACT);
}
Test(lm, qwen2_5_vl_text_bf16)
{
    check_model("qwen2_5_vl", "model.bf16.safetensors", 2e-2, GREEDY_UNTIL_NEAR_TIE);
}

/* The Qwen3 generation, on the CPU. */
#define F32 "model.safetensors"
#define BF16 "model.bf16.safetensors"
static const model_check qwen3_checks[] = {
    {"cpu", "qwen3", F32, 1e-4, GREEDY_EXACT, false, NULL},
    /* BF16 weights: the fixtures' README measures 5e-3 to 1.1e-2 for qwen3, so the
     * issue's "1e-2" is held as 1.2e-2; qwen3_moe with the F32 model's expert choices
     * (bf16 rounding flips some top-2 choices, 3e-2 to 6e-2 without them) likewise */
    {"cpu", "qwen3", BF16, 1.2e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "qwen3_moe", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "qwen3_moe", BF16, 1.2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
    /* Qwen3-VL's text model (interleaved M-RoPE, model.language_model.*), its image
     * cases with the DeepStack features (case 3: two images); BF16 weights move its
     * logits by 4.1e-3 to 6.9e-3 (measured), under the 1e-2 */
    {"cpu", "qwen3_vl", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "qwen3_vl", BF16, 1e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
};
Test(lm, qwen3_f32) { check_model_with(&qwen3_checks[0]); }
Test(lm, qwen3_bf16) { check_model_with(&qwen3_checks[1]); }
Test(lm, qwen3_moe_f32) { check_model_with(&qwen3_checks[2]); }
Test(lm, qwen3_moe_bf16_with_f32_routing) { check_model_with(&qwen3_checks[3]); }
Test(lm, qwen3_vl_f32) { check_model_with(&qwen3_checks[4]); }
Test(lm, qwen3_vl_bf16) { check_model_with(&qwen3_checks[5]); }

/* GLM-4.5 (GLM-4.5-Air-like: partial NeoX rotary, q/k/v biases, the sigmoid
 * router with its correction bias, a shared expert, a dense first layer, the
 * MTP layer stored and never run) and Mixtral (softmax top-2 experts w1, w3,
 * w2), made by the reference port (their README section). BF16 weights with
 * the F32 model's expert choices: rounding alone moves them 5.3e-3 to
 * 2.0e-2 (GLM; README, measured with its own choices, some flipped) and
 * 4.4e-3 to 6.1e-3 (Mixtral). */
static const model_check glm_mixtral_checks[] = {
    {"cpu", "glm4_moe", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "glm4_moe", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
    {"cpu", "mixtral", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "mixtral", BF16, 1.2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
};
Test(lm, glm4_moe_f32) { check_model_with(&glm_mixtral_checks[0]); }
Test(lm, glm4_moe_bf16_with_f32_routing) { check_model_with(&glm_mixtral_checks[1]); }
Test(lm, mixtral_f32) { check_model_with(&glm_mixtral_checks[2]); }
Test(lm, mixtral_bf16_with_f32_routing) { check_model_with(&glm_mixtral_checks[3]); }

/* Qwen3.5 (hybrid: Gated DeltaNet and gated attention, (1 + w) norms,
 * partial interleaved M-RoPE; an image case of two images) and Qwen3.5-MoE
 * (fused experts, the gated shared expert, Hv = 2 Hk, dk != dv), made by the
 * reference port (their README section): F32 within 1e-4, greedy exact; BF16
 * weights move the logits 1.5e-2 to 2.4e-2 (dense) and 2.5e-2 to 5.4e-2
 * (MoE) in the README's measurement, so 3e-2 and 6e-2 up to a near tie. */
static const model_check qwen3_5_checks[] = {
    {"cpu", "qwen3_5", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "qwen3_5_moe", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "qwen3_5", BF16, 3e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "qwen3_5_moe", BF16, 6e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
};
Test(lm, qwen3_5_f32) { check_model_with(&qwen3_5_checks[0]); }
Test(lm, qwen3_5_moe_f32) { check_model_with(&qwen3_5_checks[1]); }
Test(lm, qwen3_5_bf16) { check_model_with(&qwen3_5_checks[2]); }
Test(lm, qwen3_5_moe_bf16_with_f32_routing) { check_model_with(&qwen3_5_checks[3]); }

/* Quantized checkpoints as published (tests/fixtures/quant, their README
 * section): FP8 with 128x128 block scales (F32 and BF16 scales, partial
 * blocks) and per channel, AWQ, GPTQ v1 and v2, compressed-tensors int4;
 * dense and MoE. The reference is weight-only: the float32 model on the
 * dequantized weights, which the CPU dequantizes exactly as it does (the
 * spot values below are bit-equal). The checkpoints' other tensors are BF16
 * or F16, so the CPU keeps its KV cache in that type, and with BF16 on
 * AVX-512 BF16 CPUs rounds activations to bf16 (measured here: 3.5e-3 to
 * 4.5e-3 with BF16, under 2e-3 with F16; with an fp32 KV cache and fp32
 * activations all seven are within 1e-5 and greedy-exact): a 16-bit path
 * as the README bounds it, 1e-2 and equal greedy tokens up to a near tie. */
#define QUANT_TOL 1.2e-2
static const model_check quant_checks[] = {
    {"cpu", "quant/qwen3_fp8_block", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "quant/qwen3_fp8_channel_ct", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "quant/qwen3_moe_fp8_block_bf16scale", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false,
     NULL},
    {"cpu", "quant/qwen3_awq", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "quant/qwen3_gptq_v2", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "quant/qwen3_moe_gptq", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "quant/qwen3_w4a16_ct", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    /* FP8 weights per channel and an FP8 KV cache (K and V e4m3 at the checkpoint's
     * per-layer scales, saturated: the reference's own rounding) */
    {"cpu", "quant/qwen3_fp8_kv", F32, QUANT_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL, false,
     KV_FP8_CHECKPOINT},
};
/* W8A8 (--fp8-activations on): each FP8 linear's input rounded through e4m3
 * per token and 128 columns (the block format) or per row (channel), against
 * the reference's own W8A8 forward (F32 emulation, the same group bounds).
 * Rounding activations to 3 mantissa bits makes the forward chaotic: an
 * fp32 sum in another order moves a value across a rounding midpoint and
 * the change grows layer after layer. Measured here: with the C kernels and
 * an fp32 KV cache, 2 of 3 cases within 1e-5 and one 9e-4; the AVX2 GEMV's
 * other order alone, 2.7e-2; with the 16-bit KV cache 6.3e-2 to 1.2e-1
 * (README: a BF16 path is ~1e-1 from it), while W8A8 and W8A16 are 8.8e-2
 * to 1.4e-1 apart. So the model is held to 1.5e-1 and to being nearer the
 * W8A8 reference than the weight-only one, and the greedy tokens are not
 * compared; the product itself is held to 1e-6 (test_quant's probe,
 * test_cpu_ops' definition). */
#define W8A8_TOL 1.5e-1
static const model_check w8a8_checks[] = {
    {"cpu", "quant/qwen3_fp8_block", F32, W8A8_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL, true},
    {"cpu", "quant/qwen3_fp8_channel_ct", F32, W8A8_TOL, GREEDY_UNTIL_NEAR_TIE, false, NULL, true},
    {"cpu", "quant/qwen3_moe_fp8_block_bf16scale", F32, W8A8_TOL, GREEDY_UNTIL_NEAR_TIE, false,
     NULL, true},
};
Test(lm, quant_fp8_block_w8a8) { check_model_with(&w8a8_checks[0]); }
Test(lm, quant_fp8_channel_w8a8) { check_model_with(&w8a8_checks[1]); }
Test(lm, quant_moe_fp8_block_w8a8) { check_model_with(&w8a8_checks[2]); }
Test(lm, quant_fp8_block) { check_model_with(&quant_checks[0]); }
Test(lm, quant_fp8_channel_compressed_tensors) { check_model_with(&quant_checks[1]); }
Test(lm, quant_moe_fp8_block_bf16_scales) { check_model_with(&quant_checks[2]); }
Test(lm, quant_awq) { check_model_with(&quant_checks[3]); }
Test(lm, quant_gptq_v2) { check_model_with(&quant_checks[4]); }
Test(lm, quant_moe_gptq_v1) { check_model_with(&quant_checks[5]); }
Test(lm, quant_w4a16_compressed_tensors) { check_model_with(&quant_checks[6]); }
Test(lm, quant_fp8_kv_cache) { check_model_with(&quant_checks[7]); }

/* An FP8 KV cache at scales measured on vlmd's calibration text, for
 * checkpoints without scales (BF16 weights): each fixture's cases against its
 * F32 reference, greedy tokens equal up to a near tie. Measured: 4.7e-2 to
 * 6.1e-2 (qwen2, qwen3; BF16 weights and the 16-bit cache alone: 1e-2 to
 * 2e-2), 1.5e-2 to 3.0e-2 (qwen3_5, three of whose four layers keep no KV). */
static const model_check measured_kv_checks[] = {
    {"cpu", "qwen2", "model.bf16.safetensors", 8e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL, false,
     KV_FP8_MEASURED},
    {"cpu", "qwen3", "model.bf16.safetensors", 8e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL, false,
     KV_FP8_MEASURED},
    {"cpu", "qwen3_5", "model.bf16.safetensors", 4e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL, false,
     KV_FP8_MEASURED},
};
/* The same on the CUDA backend (bf16 activations; emulated in test_lm_emu):
 * its rope_kv_write stores e4m3 codes and its attention reads them. Measured
 * 5.6e-2 and 5.8e-2 on qwen2. (qwen3's case 2 flips token 2 at a margin of
 * 0.0625 there, 0.0235 on the CPU with FP8 KV: a near tie that bf16
 * activations and the FP8 cache together move past the 2% rule.) */
static const model_check measured_kv_cuda_checks[] = {
    {"cuda", "qwen2", "model.bf16.safetensors", 8e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL, false,
     KV_FP8_MEASURED},
};
Test(lm, cuda_fp8_kv_cache_measured_scales)
{
    check_model_with(&measured_kv_cuda_checks[0]);
}

Test(lm, fp8_kv_cache_measured_scales)
{
    for (size_t i = 0; i < sizeof measured_kv_checks / sizeof *measured_kv_checks; i++)
        check_model_with(&measured_kv_checks[i]);
}

/* The FP8 KV cache is what moves the fixture's logits: the same weights
 * with the 16-bit cache are farther from its reference than the FP8 one
 * (the README measures the KV rounding at 5.6e-2), and the scales come from
 * the checkpoint, each layer's own. */
Test(lm, quant_fp8_kv_cache_is_what_the_reference_rounds)
{
    fixture f;
    open_fixture(&f, "quant/qwen3_fp8_kv", "model.safetensors");
    const int V = (int)lm_vocab_size(f.m);
    const float *ref = vlmd_safetensors_find(f.ref, "case0.logits")->data;
    double rel[2];
    for (int fp8 = 0; fp8 < 2; fp8++) {
        if (fp8)
            fp8_kv_from_checkpoint(&f, "quant/qwen3_fp8_kv", "model.safetensors");
        cr_expect_eq(vlmd_backend_kv_elem_size(f.b), fp8 ? 1u : 2u);
        int n;
        float *logits = case_logits(f.m, &f, 0, &n);
        rel[fp8] = test_rel_error(logits, ref, (size_t)n * V);
        free(logits);
    }
    cr_expect_lt(rel[1], rel[0], "FP8 KV %.3g from the reference, 16-bit %.3g", rel[1], rel[0]);
    cr_expect_lt(rel[1], 5e-3, "FP8 KV %.3g from its reference (measured 1.65e-3)", rel[1]);
    cr_expect_gt(rel[0], 2e-2, "the 16-bit cache misses the reference's rounding: %.3g", rel[0]);
    const float *k, *v;
    cr_assert(lm_kv_scales(f.m, &k, &v));
    json_t *scales = json_object_get(json_object_get(f.json, "quantization"), "kv_scales");
    const char *key;
    json_t *kvs;
    json_object_foreach(scales, key, kvs)
    {
        int l = atoi(key);
        cr_expect_float_eq(k[l], (float)json_real_value(json_array_get(kvs, 0)), 1e-7, "k %d", l);
        cr_expect_float_eq(v[l], (float)json_real_value(json_array_get(kvs, 1)), 1e-7, "v %d", l);
    }
    close_fixture(&f);
}

/* Through the CUDA backend (bf16 weights and activations): where a GPU is
 * visible, the logits of every text case of every model against the
 * reference and the greedy continuation up to any near tie; elsewhere the
 * backend's clear refusal. */
Test(lm, cuda_bf16_all_models)
{
    const char *models[] = {"qwen2", "qwen2_vl", "qwen2_5_vl"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        check_model_on("cuda", models[i], BF16, 3e-2, GREEDY_UNTIL_NEAR_TIE);
}

/* The Qwen3 generation the same way, once the CUDA table has what each
 * model needs (lm_backend_check); until then its load is refused, naming
 * what is missing (open_fixture_routed). The MoE model replays the CPU F32
 * model's expert choices; Qwen3-VL's image cases take their DeepStack
 * features. bf16 activations on top of the bf16 weights: on the emulator
 * (bf16 storage, fp32 arithmetic as on tensor cores) the logits moved by
 * 1.28e-2 to 1.42e-2 (qwen3), 1.26e-2 to 1.38e-2 (qwen3_moe with the F32
 * routing) and 0.73e-2 to 0.97e-2 (qwen3_vl), so the bound is 2e-2. */
Test(lm, cuda_bf16_qwen3_models)
{
    static const model_check checks[] = {
        {"cuda", "qwen3", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        {"cuda", "qwen3_moe", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
        {"cuda", "qwen3_vl", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    };
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++)
        check_model_with(&checks[i]);
}

/* GLM-4.5 (partial rotary, the sigmoid router with its bias, the shared
 * expert) and Mixtral through CUDA, each replaying the CPU F32 model's
 * expert choices (bf16 logits flip near-equal scores): on the emulator the
 * logits moved by 0.88e-2 to 1.09e-2 (GLM) and 0.72e-2 to 0.93e-2 (Mixtral). */
Test(lm, cuda_bf16_glm_mixtral_models)
{
    static const model_check checks[] = {
        {"cuda", "glm4_moe", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
        {"cuda", "mixtral", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
    };
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++)
        check_model_with(&checks[i]);
}

/* Qwen3.5 and Qwen3.5-MoE through CUDA (the Gated DeltaNet ops of
 * cuda_gdn.cu, gated attention, (1 + w) norms; the MoE model replaying the
 * CPU F32 model's expert choices), the image cases included. Measured on
 * the emulator: 1.76e-2 to 3.48e-2 (dense) and 2.25e-2 to 4.16e-2 (MoE),
 * against 1.45e-2 to 2.88e-2 and 1.66e-2 to 3.61e-2 for the CPU's BF16
 * checks on an AVX-512 BF16 machine (bf16 linear inputs alone): about a
 * fifth more, every activation being stored in bf16 here (the conv's and the
 * rule's outputs, the gated norm's, the gate's). So 4.5e-2 for the dense
 * model, over the CPU's 3e-2, and the CPU's 6e-2 for the MoE one. */
Test(lm, cuda_bf16_qwen3_5_models)
{
    static const model_check checks[] = {
        {"cuda", "qwen3_5", BF16, 4.5e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        {"cuda", "qwen3_5_moe", BF16, 6e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
    };
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++)
        check_model_with(&checks[i]);
}

/* Quantized checkpoints through CUDA (qlinear, moe_experts_q: every format of
 * tests/fixtures/quant: FP8 in 128 x 128 blocks or per channel, AWQ, GPTQ v1
 * and v2, compressed-tensors INT4, dense and MoE), the MoE replaying the CPU's
 * expert choices on the same checkpoint; against the weight-only F32
 * reference like quant_checks, with bf16 activations and the other weights
 * in bf16 on top. Measured on the emulator: 1.10e-2 to 1.14e-2 (fp8_block),
 * 1.68e-2 to 1.80e-2 (awq, whose F16 tensors lose 3 bits as bf16), 1.38e-2
 * to 1.75e-2 (moe_gptq), 1.08e-2 to 1.16e-2 (fp8 per channel, MoE fp8),
 * 1.30e-2 to 1.89e-2 (gptq_v2, w4a16); the bound 2.5e-2. (W8A8 is held at the op level,
 * test_cuda_ops: through a bf16 model it is 8.5e-2 to 9.1e-2 from its
 * reference, no nearer than the weight-only one, the chaos w8a8_checks
 * describes.) */
Test(lm, cuda_bf16_quant_models)
{
    static const model_check checks[] = {
        {"cuda", "quant/qwen3_fp8_block", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        {"cuda", "quant/qwen3_awq", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        {"cuda", "quant/qwen3_moe_gptq", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
        {"cuda", "quant/qwen3_fp8_channel_ct", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        {"cuda", "quant/qwen3_moe_fp8_block_bf16scale", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE,
         false, F32},
        {"cuda", "quant/qwen3_gptq_v2", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        {"cuda", "quant/qwen3_w4a16_ct", F32, 2.5e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
        /* and its FP8 KV cache: K and V reach e4m3 through bf16 here, and a value that
         * bf16 moved across an e4m3 rounding midpoint takes the neighbouring code (3 bits
         * of mantissa), so 2.8e-2 to 3.2e-2 (the CPU, from fp32: 1.7e-3) */
        {"cuda", "quant/qwen3_fp8_kv", F32, 4e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL, false,
         KV_FP8_CHECKPOINT},
    };
    vlmd_backend *b;
    if (test_backend_open("cuda", &b)) { /* taken, not refused (which check_model_with allows) */
        for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
            vlmd_model_config mc;
            vlmd_error err = {0};
            cr_assert_eq(vlmd_model_config_load(test_fixture(checks[i].model), &mc, &err),
                         VLMD_OK, "%s", err.msg);
            cr_expect_eq(lm_backend_check(b, &mc, &err), VLMD_OK, "%s", err.msg);
        }
        vlmd_backend_destroy(b);
    }
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++)
        check_model_with(&checks[i]);
}

/* The logits of a packed prefill of 3 prompts and of 3 decode steps that
 * replay the captured graphs (capture false: run eagerly), through CUDA with
 * programmatic dependent launch off (pdl 0) or on (1); NULL where there is
 * no CUDA device. */
static float *pdl_logits(const char *model, int pdl, bool capture, size_t *count)
{
    vlmd_backend *b;
    if (!test_backend_open_pdl("cuda", pdl, &b))
        return NULL;
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &mc, &err), VLMD_OK, "%s", err.msg);
    lm_model *m = load_model(b, &mc, model, BF16);
    enum { SEQS = 3, LEN = 6, STEPS = 3, CTX = LEN + STEPS, SLOTS = SEQS * CTX };
    const int V = (int)lm_vocab_size(m);
    lm_kv *kv;
    lm_workspace *ws;
    /* (a hybrid model's sequences take state slots 0..SEQS-1; the others ignore them) */
    cr_assert_eq(lm_kv_create_hybrid(m, SLOTS, SEQS, &kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(m, SEQS * LEN, SEQS, CTX, &ws, &err), VLMD_OK, "%s", err.msg);
    const int32_t state_slots[SEQS] = {0, 1, 2};
    if (capture)
        cr_assert_eq(lm_capture_decode(m, kv, ws, &err), VLMD_OK, "%s", err.msg);
    *count = (size_t)SEQS * V * (1 + STEPS);
    float *logits = malloc(*count * sizeof *logits);
    int32_t ids[SEQS * LEN], pos[3 * SEQS * LEN], slots[SLOTS], rows[SEQS];
    vlmd_attn_seq seqs[SEQS];
    for (int s = 0; s < SEQS; s++) {
        seqs[s] = (vlmd_attn_seq){s * LEN, LEN, LEN, slots + s * CTX};
        rows[s] = s * LEN + LEN - 1;
        for (int i = 0; i < CTX; i++)
            slots[s * CTX + i] = s * CTX + i;
        for (int i = 0; i < LEN; i++) {
            ids[s * LEN + i] = (s * 131 + i * 17 + 3) % V;
            for (int r = 0; r < 3; r++)
                pos[r * SEQS * LEN + s * LEN + i] = i;
        }
    }
    int32_t prefill_slots[SEQS * LEN];
    for (int s = 0; s < SEQS; s++)
        for (int i = 0; i < LEN; i++)
            prefill_slots[s * LEN + i] = slots[s * CTX + i];
    lm_batch prefill = {SEQS * LEN, ids,  pos,  prefill_slots, seqs, SEQS,
                        rows,       SEQS, NULL, 0,             state_slots};
    cr_assert_eq(lm_forward(m, kv, ws, &prefill, logits, &err), VLMD_OK, "%s", err.msg);
    for (int k = 0; k < STEPS; k++) { /* each sequence's greedy next token */
        int32_t step_ids[SEQS], step_pos[3 * SEQS], step_slots[SEQS];
        const float *last = logits + (size_t)k * SEQS * V;
        for (int s = 0; s < SEQS; s++) {
            int len = LEN + k;
            step_ids[s] = argmax(last + (size_t)s * V, V);
            step_slots[s] = slots[s * CTX + len];
            for (int r = 0; r < 3; r++)
                step_pos[r * SEQS + s] = len;
            rows[s] = s;
            seqs[s] = (vlmd_attn_seq){s, 1, len + 1, slots + s * CTX};
        }
        lm_batch decode = {SEQS, step_ids, step_pos, step_slots, seqs,
                           SEQS, rows,     SEQS,     NULL,       0,    state_slots};
        cr_assert_eq(lm_forward(m, kv, ws, &decode, logits + (size_t)(k + 1) * SEQS * V, &err),
                     VLMD_OK, "%s", err.msg);
    }
    cr_expect_eq(lm_decode_graph_steps(ws), capture ? STEPS : 0, "the decode steps replayed "
                 "graphs");
    lm_workspace_free(m, ws);
    lm_kv_free(m, kv);
    lm_free(m);
    vlmd_backend_destroy(b);
    return logits;
}

#ifdef VLMD_CUDA_EMULATED
unsigned long long vlmd_cuda_emu_kernels_run(void); /* tests/cuda_emu */

/* A decode step's graph says how many kernels it launches (what the kit
 * prints a step): the count the emulator runs when the same step of as many
 * sequences runs eagerly, for each captured size; and at least one a layer. */
Test(lm, cuda_decode_graphs_count_the_kernels_a_step_runs)
{
    vlmd_backend *b;
    if (!test_backend_open("cuda", &b))
        return;
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen2"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    lm_model *m = load_model(b, &mc, "qwen2", BF16);
    enum { SEQS = 4, CTX = 8 };
    const int V = (int)lm_vocab_size(m);
    lm_kv *kv;
    lm_workspace *eager, *captured;
    cr_assert_eq(lm_kv_create(m, SEQS * CTX + 1, &kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(m, SEQS * CTX, SEQS, CTX, &eager, &err), VLMD_OK, "%s",
                 err.msg);
    cr_assert_eq(lm_workspace_create(m, SEQS * CTX, SEQS, CTX, &captured, &err), VLMD_OK, "%s",
                 err.msg);
    cr_assert_eq(lm_capture_decode(m, kv, captured, &err), VLMD_OK, "%s", err.msg);
    float *logits = malloc((size_t)SEQS * V * sizeof *logits);
    int32_t slots[SEQS * CTX];
    for (int i = 0; i < SEQS * CTX; i++)
        slots[i] = i;
    for (int rows = 1; rows <= SEQS; rows *= 2) {
        int32_t ids[SEQS], pos[3 * SEQS], step_slots[SEQS], out_rows[SEQS];
        vlmd_attn_seq seqs[SEQS];
        for (int s = 0; s < rows; s++) {
            ids[s] = (s * 7 + 1) % V, step_slots[s] = s * CTX + 2, out_rows[s] = s;
            for (int r = 0; r < 3; r++)
                pos[r * rows + s] = 2;
            seqs[s] = (vlmd_attn_seq){s, 1, 3, slots + s * CTX};
        }
        lm_batch step = {rows, ids, pos, step_slots, seqs, rows, out_rows, rows, NULL, 0, NULL};
        /* (the capture's eager warm-up runs are queued until a wait) */
        cr_assert_eq(vlmd_backend_synchronize(b, &err), VLMD_OK, "%s", err.msg);
        unsigned long long before = vlmd_cuda_emu_kernels_run();
        cr_assert_eq(lm_forward(m, kv, eager, &step, logits, &err), VLMD_OK, "%s", err.msg);
        unsigned long long ran = vlmd_cuda_emu_kernels_run() - before;
        int counted = lm_decode_graph_kernels(captured, rows);
        cr_expect_eq((unsigned long long)counted, ran,
                     "%d sequences: the graph counts %d kernels, the eager step ran %llu", rows,
                     counted, ran);
        cr_expect_geq(counted, mc.text.num_layers, "%d kernels over %d layers", counted,
                      mc.text.num_layers);
    }
    cr_expect_eq(lm_decode_graph_kernels(captured, SEQS * CTX + 1), -1, "no graph that large");
    free(logits);
    lm_workspace_free(m, eager);
    lm_workspace_free(m, captured);
    lm_kv_free(m, kv);
    lm_free(m);
    vlmd_backend_destroy(b);
}
#endif

/* Programmatic dependent launch lets a kernel start before its predecessor
 * ends (each waits in vlmd_kernel_start before reading): a read before the
 * wait would change the numbers on a GPU, so the logits must be the same
 * bits with it off and on (the emulator runs launches one after another:
 * there it checks the test; tools/device runs it on a GPU). Qwen2, and
 * GLM-4.5 (partial rotary, the sigmoid router, the shared expert), whose
 * decode steps are captured too (a capture refuses an op that allocates or
 * waits). */
Test(lm, cuda_logits_are_the_same_bits_with_pdl_off_and_on)
{
    const char *models[] = {"qwen2", "glm4_moe"};
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        size_t n_off = 0, n_on = 0;
        float *off = pdl_logits(models[mi], 0, true, &n_off);
        if (!off)
            return; /* no CUDA device: test_backend_open_pdl checked the refusal */
        float *on = pdl_logits(models[mi], 1, true, &n_on);
        cr_assert_not_null(on);
        cr_assert_eq(n_on, n_off);
        size_t differ = 0;
        for (size_t i = 0; i < n_off; i++)
            differ += memcmp(&off[i], &on[i], sizeof off[i]) != 0;
        cr_expect_eq(differ, 0, "%s: %zu of %zu logits differ with PDL on", models[mi], differ,
                     n_off);
        free(off);
        free(on);
    }
}

/* A model's decode steps through CUDA graphs give the eager steps' logits
 * (the emulator gives the same bits; the bound leaves cuBLAS room to pick
 * another algorithm under capture on a GPU). */
static void expect_graphs_give_the_eager_logits(const char *model)
{
    size_t n_graph = 0, n_eager = 0;
    float *graph = pdl_logits(model, 0, true, &n_graph);
    if (!graph)
        return;
    float *eager = pdl_logits(model, 0, false, &n_eager);
    cr_assert_eq(n_graph, n_eager);
    double rel = test_rel_error(graph, eager, n_graph);
    size_t differ = 0;
    for (size_t i = 0; i < n_graph; i++)
        differ += memcmp(&graph[i], &eager[i], sizeof *graph) != 0;
    fprintf(stderr, "cuda %s decode graphs: %zu of %zu logits differ from eager, "
            "relative error %.3g\n", model, differ, n_graph, rel);
    cr_expect_lt(rel, 1e-3, "%s: graph logits against eager: %g", model, rel);
    free(graph);
    free(eager);
}

/* GLM-4.5's: the rotary op's partial form and the sigmoid router read what
 * each replay is given (positions, slots, router logits and bias) from
 * device memory. */
Test(lm, cuda_glm4_moe_decode_graphs_give_the_eager_logits)
{
    expect_graphs_give_the_eager_logits("glm4_moe");
}

/* Qwen3.5's: the Gated DeltaNet ops read each replay's sequences (rows, state
 * slots, fresh or not) from device memory and carry the conv and recurrent
 * states in their slots from step to step; the padding rows' states stay in
 * the pad slot. */
Test(lm, cuda_qwen3_5_decode_graphs_give_the_eager_logits)
{
    expect_graphs_give_the_eager_logits("qwen3_5");
}

Test(lm, missing_and_misshaped_tensors_are_named)
{
    fixture f;
    open_fixture(&f, "qwen2", "model.safetensors");
    vlmd_model_config wrong = f.mc;
    wrong.text.intermediate_size += 1;
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen2", "model.safetensors"), &st,
                                            NULL), VLMD_OK);
    lm_model *m = NULL;
    vlmd_error err = {0};
    cr_expect_eq(lm_load(f.b, &wrong, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "mlp.gate_proj.weight has shape [256, 128], expected [257, 128]"),
              "%s", err.msg);
    cr_expect_null(m);
    cr_expect_eq(vlmd_backend_allocated_bytes(f.b) > 0, true, "the good model's weights");
    vlmd_model_config more = f.mc;
    more.text.num_layers += 1;
    cr_expect_eq(lm_load(f.b, &more, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "missing tensor model.layers.3."), "%s", err.msg);
    vlmd_safetensors_close(st);
    close_fixture(&f);
}

/* A prompt prefilled in chunks (each attending to the chunks before it in
 * the KV cache) gives the logits of the one-shot prefill: within 1e-4 of the
 * reference for chunks of 7, 64 and 4096 tokens (F32, CPU), dense and MoE. */
Test(lm, chunked_prefill_matches_one_shot)
{
    const char *models[] = {"qwen2", "qwen2_vl", "qwen3", "qwen3_moe"};
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        fixture f;
        open_fixture(&f, models[mi], "model.safetensors");
        const int V = (int)lm_vocab_size(f.m), max = 256;
        lm_kv *kv = NULL;
        lm_workspace *ws = NULL;
        cr_assert_eq(lm_kv_create(f.m, max, &kv, NULL), VLMD_OK);
        cr_assert_eq(lm_workspace_create(f.m, max, max, max, &ws, NULL), VLMD_OK);
        json_t *ids_j = json_object_get(json_array_get(json_object_get(f.json, "cases"), 1),
                                        "input_ids");
        int n = (int)json_array_size(ids_j);
        const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, "case1.logits");
        cr_assert_not_null(lt);
        const float *ref = lt->data;
        int32_t ids[256], pos[3 * 256], slots[256], rows[256];
        float *logits = malloc((size_t)n * V * sizeof *logits);
        const int chunks[] = {7, 64, 4096};
        for (int c = 0; c < 3; c++) {
            for (int i = 0; i < n; i++) {
                ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
                slots[i] = max - 1 - i; /* any slots will do: not in position order */
            }
            for (int start = 0; start < n; start += chunks[c]) {
                int len = n - start < chunks[c] ? n - start : chunks[c];
                for (int i = 0; i < len; i++) {
                    rows[i] = i;
                    for (int r = 0; r < 3; r++)
                        pos[r * len + i] = start + i;
                }
                vlmd_attn_seq seq = {0, len, start + len, slots};
                lm_batch bt = {len, ids + start, pos, slots + start, &seq, 1, rows, len,
                                  NULL, 0};
                vlmd_error err = {0};
                cr_assert_eq(lm_forward(f.m, kv, ws, &bt, logits + (size_t)start * V, &err),
                             VLMD_OK, "%s", err.msg);
            }
            double rel = test_rel_error(logits, ref, (size_t)n * V);
            cr_expect_lt(rel, 1e-4, "%s, chunks of %d: relative error %.3g", models[mi],
                         chunks[c], rel);
        }
        free(logits);
        lm_workspace_free(f.m, ws);
        lm_kv_free(f.m, kv);
        close_fixture(&f);
    }
}

/* A decode batch through the captured graphs (the CPU replays the call)
 * gives the eager logits: 11 sequences of different lengths padded to the
 * graph of 12 (sizes 1, 2, 4, 8 and the largest, 12), whose padding rows
 * write the pad slot and leave every real slot as eager left it. */
Test(lm, decode_graphs_pad_a_batch_and_give_the_eager_logits)
{
    fixture f;
    open_fixture(&f, "qwen2", "model.safetensors");
    enum { SEQS = 11, MAX = 12, CTX = 9, SLOTS = SEQS * CTX };
    const int V = (int)lm_vocab_size(f.m);
    lm_kv *kv[2];
    lm_workspace *ws[2];
    vlmd_error err = {0};
    int32_t ids[SLOTS], pos[3 * SLOTS], slots[SLOTS], rows[SLOTS];
    vlmd_attn_seq seqs[SEQS];
    float *logits[2] = {malloc((size_t)SEQS * V * sizeof(float)),
                        malloc((size_t)SEQS * V * sizeof(float))};
    for (int g = 0; g < 2; g++) {
        cr_assert_eq(lm_kv_create(f.m, SLOTS, &kv[g], &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(lm_workspace_create(f.m, SLOTS, MAX, CTX, &ws[g], &err), VLMD_OK, "%s",
                     err.msg);
        if (g) {
            cr_assert_eq(lm_capture_decode(f.m, kv[g], ws[g], &err), VLMD_OK, "%s", err.msg);
            cr_expect_eq(lm_decode_graph_count(ws[g]), 5);
            cr_expect_eq(lm_decode_graph_max(ws[g]), MAX);
        }
        /* prompts of 3..8 tokens (eager: a prefill is no decode step) */
        int n = 0;
        for (int s = 0; s < SEQS; s++) {
            int len = 3 + s % 6;
            seqs[s] = (vlmd_attn_seq){n, len, len, slots + s * CTX};
            for (int i = 0; i < len; i++) {
                ids[n + i] = (s * 31 + i * 7) % V;
                slots[s * CTX + i] = s * CTX + i;
                for (int r = 0; r < 3; r++)
                    pos[r * SLOTS + n + i] = i;
            }
            n += len;
        }
        int32_t step_ids[SLOTS], step_pos[3 * SLOTS], step_slots[SLOTS];
        for (int i = 0, s = 0; s < SEQS; s++)
            for (int k = 0; k < seqs[s].q_len; k++, i++) {
                step_ids[i] = ids[i];
                step_slots[i] = slots[s * CTX + k];
                for (int r = 0; r < 3; r++)
                    step_pos[r * n + i] = pos[r * SLOTS + i];
            }
        lm_batch prefill = {n, step_ids, step_pos, step_slots, seqs, SEQS, rows, 0, NULL, 0};
        cr_assert_eq(lm_forward(f.m, kv[g], ws[g], &prefill, NULL, &err), VLMD_OK, "%s",
                     err.msg);
        /* one decode step: each sequence's next token */
        for (int s = 0; s < SEQS; s++) {
            int len = seqs[s].kv_len;
            step_ids[s] = (s * 17 + 5) % V;
            step_slots[s] = slots[s * CTX + len] = s * CTX + len;
            for (int r = 0; r < 3; r++)
                step_pos[r * SEQS + s] = len;
            rows[s] = s;
            seqs[s] = (vlmd_attn_seq){s, 1, len + 1, slots + s * CTX};
        }
        lm_batch decode = {SEQS, step_ids, step_pos, step_slots, seqs, SEQS, rows, SEQS,
                              NULL, 0};
        cr_assert_eq(lm_forward(f.m, kv[g], ws[g], &decode, logits[g], &err), VLMD_OK, "%s",
                     err.msg);
    }
    cr_expect_eq(lm_decode_graph_steps(ws[0]), 0);
    cr_expect_eq(lm_decode_graph_steps(ws[1]), 1, "the decode step replayed the graph of 12");
    double rel = test_rel_error(logits[1], logits[0], (size_t)SEQS * V);
    cr_expect_lt(rel, 1e-6, "graph logits against eager: %g", rel);
    for (int g = 0; g < 2; g++) {
        lm_workspace_free(f.m, ws[g]);
        lm_kv_free(f.m, kv[g]);
        free(logits[g]);
    }
    close_fixture(&f);
}


/* Every case of a model in one step, packed (each its own sequence, all
 * rows' logits): each within 1e-4 of its reference, as alone. A MoE layer
 * routes each token on its own, whatever shares its step. */
Test(lm, a_packed_batch_of_every_case_matches_each_alone)
{
    const char *models[] = {"qwen3", "qwen3_moe"};
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        fixture f;
        open_fixture(&f, models[mi], "model.safetensors");
        const int V = (int)lm_vocab_size(f.m), max = 512;
        json_t *cases = json_object_get(f.json, "cases");
        int n_seqs = (int)json_array_size(cases), n = 0;
        int32_t ids[512], pos[3 * 512], slots[512], rows[512];
        vlmd_attn_seq seqs[8];
        cr_assert_leq(n_seqs, 8);
        for (int q = 0; q < n_seqs; q++) {
            json_t *ids_j = json_object_get(json_array_get(cases, (size_t)q), "input_ids");
            int len = (int)json_array_size(ids_j);
            cr_assert_leq(n + len, max);
            seqs[q] = (vlmd_attn_seq){n, len, len, slots + n};
            for (int i = 0; i < len; i++) {
                ids[n + i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
                slots[n + i] = max - 1 - (n + i);
                rows[n + i] = n + i;
            }
            n += len;
        }
        for (int q = 0, i = 0; q < n_seqs; q++)
            for (int k = 0; k < seqs[q].q_len; k++, i++)
                for (int r = 0; r < 3; r++)
                    pos[r * n + i] = k;
        lm_kv *kv = NULL;
        lm_workspace *ws = NULL;
        vlmd_error err = {0};
        cr_assert_eq(lm_kv_create(f.m, max, &kv, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(lm_workspace_create(f.m, max, max, max, &ws, &err), VLMD_OK, "%s",
                     err.msg);
        float *logits = malloc((size_t)n * V * sizeof *logits);
        lm_batch bt = {n, ids, pos, slots, seqs, n_seqs, rows, n, NULL, 0};
        cr_assert_eq(lm_forward(f.m, kv, ws, &bt, logits, &err), VLMD_OK, "%s", err.msg);
        for (int q = 0; q < n_seqs; q++) {
            char name[64];
            snprintf(name, sizeof name, "case%d.logits", q);
            const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, name);
            cr_assert_not_null(lt);
            double rel = test_rel_error(logits + (size_t)seqs[q].q_start * V, lt->data,
                                        (size_t)seqs[q].q_len * V);
            cr_expect_lt(rel, 1e-4, "%s case %d in the batch: relative error %.3g", models[mi],
                         q, rel);
        }
        free(logits);
        lm_workspace_free(f.m, ws);
        lm_kv_free(f.m, kv);
        close_fixture(&f);
    }
}

/* The image runs of a prompt's rows [a, b), as rows of that part */
static int slice_runs(const lm_embed_run *runs, int n_runs, int a, int b, size_t H,
                      lm_embed_run *out)
{
    int k = 0;
    for (int i = 0; i < n_runs; i++) {
        int lo = runs[i].row > a ? runs[i].row : a;
        int hi = runs[i].row + runs[i].n_rows < b ? runs[i].row + runs[i].n_rows : b;
        if (lo < hi)
            out[k++] = (lm_embed_run){lo - a, hi - lo,
                                      runs[i].data + (size_t)(lo - runs[i].row) * H,
                                      runs[i].feature_stride};
    }
    return k;
}

/* Qwen3.5's state (conv and recurrent, per DeltaNet layer) carried across
 * calls and kept apart in a batch, F32 within 1e-4:
 * - the fixture's chunked case (tokens 0..36, then the rest continuing from
 *   the state slot; the MoE one cut inside an image's tokens) gives the
 *   reference's chunked_logits, on a slot that held another sequence before
 *   (a fresh sequence reads none of it);
 * - every case packed in one step, each on its own state slot, gives each
 *   one's logits, and again in a second step over the same slots. */
Test(lm, qwen3_5_state_is_carried_across_calls_and_kept_apart_in_a_batch)
{
    const char *models[] = {"qwen3_5", "qwen3_5_moe"};
    for (size_t mi = 0; mi < 2; mi++) {
        fixture f;
        open_fixture(&f, models[mi], "model.safetensors");
        enum { MAX = 512, CASES = 8 };
        const int V = (int)lm_vocab_size(f.m);
        const size_t H = lm_hidden_size(f.m);
        json_t *cases = json_object_get(f.json, "cases");
        const int n_cases = (int)json_array_size(cases);
        cr_assert_leq(n_cases, CASES);
        lm_kv *kv = NULL;
        lm_workspace *ws = NULL;
        vlmd_error err = {0};
        cr_assert_eq(lm_kv_create_hybrid(f.m, MAX, CASES, &kv, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(lm_workspace_create(f.m, MAX, MAX, MAX, &ws, &err), VLMD_OK, "%s",
                     err.msg);
        static int32_t ids[MAX], pos[3 * MAX], cpos[3 * MAX], slots[MAX], rows[MAX];
        for (int i = 0; i < MAX; i++)
            slots[i] = MAX - 1 - i, rows[i] = i;
        float *logits = malloc((size_t)MAX * V * sizeof *logits);

        /* packed: case q on state slot q; then once more over the same slots */
        int32_t packed_ids[MAX], packed_pos[3 * MAX], state_slots[CASES];
        vlmd_attn_seq seqs[CASES];
        lm_embed_run runs[CASES * 4], case_runs[4];
        float *arenas[CASES];
        int n = 0, n_runs = 0;
        int lens[CASES];
        for (int q = 0; q < n_cases; q++) {
            int len = lens[q] = case_inputs(&f, (size_t)q, MAX, ids, pos);
            cr_assert_leq(n + len, MAX);
            int nr = 0;
            arenas[q] = image_rows(&f, (size_t)q, ids, len, case_runs, &nr);
            for (int i = 0; i < nr; i++, n_runs++) {
                runs[n_runs] = case_runs[i];
                runs[n_runs].row += n;
            }
            memcpy(packed_ids + n, ids, (size_t)len * sizeof *ids);
            memcpy(cpos, pos, 3 * (size_t)len * sizeof *pos);
            for (int r = 0; r < 3; r++) /* (laid out below, once n is known) */
                memcpy(packed_pos + r * MAX + n, cpos + r * len, (size_t)len * sizeof *pos);
            seqs[q] = (vlmd_attn_seq){n, len, len, slots + n};
            state_slots[q] = q;
            n += len;
        }
        for (int r = 0; r < 3; r++)
            memmove(cpos + r * n, packed_pos + r * MAX, (size_t)n * sizeof *cpos);
        for (int pass = 0; pass < 2; pass++) {
            lm_batch bt = {n, packed_ids, cpos, slots, seqs, n_cases, rows, n, runs, n_runs,
                           state_slots};
            cr_assert_eq(lm_forward(f.m, kv, ws, &bt, logits, &err), VLMD_OK, "%s", err.msg);
            for (int q = 0; q < n_cases; q++) {
                char name[64];
                snprintf(name, sizeof name, "case%d.logits", q);
                double rel = test_rel_error(logits + (size_t)seqs[q].q_start * V,
                                            vlmd_safetensors_find(f.ref, name)->data,
                                            (size_t)lens[q] * V);
                cr_expect_lt(rel, 1e-4, "%s case %d packed, pass %d: relative error %.3g",
                             models[mi], q, pass, rel);
            }
        }

        /* chunked, on a slot that holds case 0's state */
        size_t ci;
        json_t *c;
        int chunked = 0;
        json_array_foreach(cases, ci, c)
        {
            json_t *cp = json_object_get(c, "chunked_prefill");
            if (!cp)
                continue;
            int len = case_inputs(&f, ci, MAX, ids, pos), nr = 0;
            int cut = (int)json_integer_value(json_array_get(json_object_get(cp, "splits"), 0));
            cr_assert(cut > 0 && cut < len);
            float *arena = image_rows(&f, ci, ids, len, case_runs, &nr);
            int32_t state_slot = 0;
            for (int part = 0; part < 2; part++) {
                int a = part ? cut : 0, b = part ? len : cut;
                lm_embed_run part_runs[4];
                int np = slice_runs(case_runs, nr, a, b, H, part_runs);
                for (int r = 0; r < 3; r++)
                    memcpy(cpos + r * (b - a), pos + r * len + a, (size_t)(b - a) * sizeof *pos);
                vlmd_attn_seq seq = {0, b - a, b, slots};
                lm_batch bt = {b - a, ids + a, cpos, slots + a, &seq, 1, rows, b - a,
                               part_runs, np, &state_slot};
                cr_assert_eq(lm_forward(f.m, kv, ws, &bt, logits + (size_t)a * V, &err),
                             VLMD_OK, "%s", err.msg);
            }
            char name[64];
            snprintf(name, sizeof name, "case%zu.chunked_logits", ci);
            const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, name);
            cr_assert_not_null(lt, "%s", name);
            double rel = test_rel_error(logits, lt->data, (size_t)len * V);
            cr_expect_lt(rel, 1e-4, "%s case %zu cut at %d: relative error %.3g", models[mi], ci,
                         cut, rel);
            free(arena);
            chunked++;
        }
        cr_expect_eq(chunked, 1, "%s: the chunked case ran", models[mi]);
        for (int q = 0; q < n_cases; q++)
            free(arenas[q]);
        free(logits);
        lm_workspace_free(f.m, ws);
        lm_kv_free(f.m, kv);
        close_fixture(&f);
    }
}

/* Prompts of 1, 63, 64, 65 and 130 tokens (around the delta rule's chunk of
 * 64) through Qwen3.5 three ways: in one step, in steps of 64, and token by
 * token; every way's logits of every position within 1e-5 of the others. */
static void prompt_three_ways(const char *device, const char *model, double tol)
{
    fixture f;
    if (!open_fixture_on(&f, model, "model.safetensors", device))
        return;
    enum { MAX = 160 };
    const int V = (int)lm_vocab_size(f.m);
    lm_kv *kv = NULL;
    lm_workspace *ws = NULL;
    vlmd_error err = {0};
    cr_assert_eq(lm_kv_create_hybrid(f.m, 3 * MAX, 3, &kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(f.m, MAX, MAX, MAX, &ws, &err), VLMD_OK, "%s", err.msg);
    float *logits[3];
    for (int w = 0; w < 3; w++)
        logits[w] = malloc((size_t)MAX * V * sizeof(float));
    const int lens[] = {1, 63, 64, 65, 130}, steps[] = {MAX, 64, 1};
    int32_t ids[MAX], pos[3 * MAX], slots[3][MAX], rows[MAX];
    for (int i = 0; i < MAX; i++) {
        ids[i] = (i * 131 + 7) % V;
        rows[i] = i;
        for (int w = 0; w < 3; w++)
            slots[w][i] = w * MAX + i;
    }
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        for (int w = 0; w < 3; w++) { /* way w on state slot w */
            int32_t state = w;
            for (int at = 0; at < n; at += steps[w]) {
                int len = n - at < steps[w] ? n - at : steps[w];
                for (int r = 0; r < 3; r++)
                    for (int i = 0; i < len; i++)
                        pos[r * len + i] = at + i;
                vlmd_attn_seq seq = {0, len, at + len, slots[w]};
                lm_batch bt = {len, ids + at, pos, slots[w] + at, &seq, 1, rows, len, NULL, 0,
                               &state};
                cr_assert_eq(lm_forward(f.m, kv, ws, &bt, logits[w] + (size_t)at * V, &err),
                             VLMD_OK, "%s", err.msg);
            }
        }
        for (int w = 1; w < 3; w++) {
            double rel = test_rel_error(logits[w], logits[0], (size_t)n * V);
            cr_expect_lt(rel, tol, "%s %s, %d tokens in steps of %d: %.3g from one step", device,
                         model, n, steps[w], rel);
        }
    }
    for (int w = 0; w < 3; w++)
        free(logits[w]);
    lm_workspace_free(f.m, ws);
    lm_kv_free(f.m, kv);
    close_fixture(&f);
}

/* The same through CUDA: the emulator gives the same bits all three ways
 * (measured: 0); a GPU's cuBLAS may pick other kernels for one step's GEMMs
 * and a token's, hence a bf16-sized bound (the kit runs it there). */
Test(lm, cuda_qwen3_5_prompts_around_the_chunk_in_one_step_in_chunks_and_token_by_token)
{
    prompt_three_ways("cuda", "qwen3_5", 2e-2);
}

Test(lm, qwen3_5_prompts_around_the_chunk_in_one_step_in_chunks_and_token_by_token)
{
    prompt_three_ways("cpu", "qwen3_5", 1e-5);
    prompt_three_ways("cpu", "qwen3_5_moe", 1e-5);
}

/* ---- what the backend's ops can run ------------------------------------------------- */

/* The CPU's op table less one piece at a time: a model that needs it is
 * refused at load, naming the backend, the piece and the architecture
 * (lm_backend_check reads the table, not the architecture), and a
 * model that does not need it still loads. */
Test(lm, a_backend_without_the_ops_a_model_needs_refuses_it)
{
    static const struct {
        const char *lacks, *model, *needs, *fine;
    } cases[] = {
        {"moe", "qwen3_moe", "no mixture-of-experts ops yet, which Qwen3MoeForCausalLM needs",
         "qwen3"},
        {"qk_norm", "qwen3", "no q/k norm in its rotary op yet, which Qwen3ForCausalLM needs",
         "qwen2_vl"},
        {"interleaved", "qwen3_vl", "no interleaved M-RoPE yet, which "
         "Qwen3VLForConditionalGeneration needs", "qwen2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        vlmd_backend *b = NULL;
        cr_assert_eq(vlmd_backend_create("cpu", &b, NULL), VLMD_OK);
        vlmd_op_table table = *vlmd_backend_ops(b);
        if (strcmp(cases[i].lacks, "moe") == 0)
            table.moe_route = NULL; /* any of the three */
        else if (strcmp(cases[i].lacks, "qk_norm") == 0)
            table.rope_qk_norm = false;
        else
            table.rope_interleaved = false;
        b->op_table = &table;
        const char *models[] = {cases[i].model, cases[i].fine};
        for (int k = 0; k < 2; k++) {
            vlmd_model_config mc;
            vlmd_safetensors *st = NULL;
            vlmd_error err = {0};
            lm_model *m = NULL;
            uint64_t bytes = 1;
            cr_assert_eq(vlmd_model_config_load(test_fixture(models[k]), &mc, NULL), VLMD_OK);
            cr_assert_eq(vlmd_safetensors_open_dir(test_fixture(models[k]), &st, NULL), VLMD_OK);
            vlmd_status want = k ? VLMD_OK : VLMD_ERR_UNAVAILABLE;
            cr_expect_eq(lm_backend_check(b, &mc, &err), want, "%s: %s", models[k], err.msg);
            cr_expect_eq(lm_weight_bytes(b, &mc, st, &bytes, &err), want, "%s", err.msg);
            cr_expect_eq(lm_load(b, &mc, st, &m, &err), want, "%s", err.msg);
            if (!k) {
                cr_expect(strstr(err.msg, cases[i].needs), "%s", err.msg);
                cr_expect(strncmp(err.msg, "the cpu", 7) == 0, "the backend named: %s", err.msg);
                cr_expect(strstr(err.msg, "(use --device cpu)"), "%s", err.msg);
                cr_expect_null(m);
                cr_expect_eq(vlmd_backend_allocated_bytes(b), 0, "nothing loaded");
            }
            lm_free(m);
            vlmd_safetensors_close(st);
        }
        vlmd_backend_destroy(b);
    }
}

/* ---- checkpoints as published -------------------------------------------------------- */

/* Builds safetensors images in memory (F32), for checkpoints the fixtures
 * do not ship: renamed, fused or broken copies of theirs. */
typedef struct st_writer {
    json_t *header;
    char *data;
    size_t len, cap;
} st_writer;

static void st_add(st_writer *w, const char *name, int ndim, const int64_t *shape,
                   const float *values)
{
    size_t count = 1;
    json_t *dims = json_array();
    for (int i = 0; i < ndim; i++) {
        count *= (size_t)shape[i];
        json_array_append_new(dims, json_integer(shape[i]));
    }
    size_t bytes = count * sizeof(float);
    if (w->len + bytes > w->cap) {
        w->cap = 2 * (w->len + bytes);
        w->data = realloc(w->data, w->cap);
        cr_assert_not_null(w->data);
    }
    memcpy(w->data + w->len, values, bytes);
    json_object_set_new(w->header, name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", dims,
                                  "data_offsets", (json_int_t)w->len,
                                  (json_int_t)(w->len + bytes)));
    w->len += bytes;
}

/* The image (the caller frees it) opened as *out; w is emptied. */
static char *st_open(st_writer *w, vlmd_safetensors **out)
{
    char *text = json_dumps(w->header, JSON_COMPACT);
    size_t hlen = (strlen(text) + 7) / 8 * 8; /* padded with spaces, as writers do */
    char *image = malloc(8 + hlen + w->len);
    cr_assert_not_null(image);
    uint64_t le = hlen;
    for (int i = 0; i < 8; i++)
        image[i] = (char)(le >> (8 * i));
    memset(image + 8, ' ', hlen);
    memcpy(image + 8, text, strlen(text));
    memcpy(image + 8 + hlen, w->data, w->len);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_memory(image, 8 + hlen + w->len, out, &err), VLMD_OK,
                 "%s", err.msg);
    free(text);
    json_decref(w->header);
    free(w->data);
    *w = (st_writer){0};
    return image;
}

/* The qwen3_moe fixture as Qwen3-VL-MoE publishes its text model: names
 * under model.language_model., each layer's experts in two fused tensors
 * stored for x . W, mlp.experts.gate_up_proj [E, H, 2 I] (gate columns,
 * then up) and mlp.experts.down_proj [E, I, H]. skip: a name left out;
 * grow: a name whose first dimension gets one more row. */
static char *fused_moe_checkpoint(const vlmd_model_config *mc, const char *skip, const char *grow,
                                  vlmd_safetensors **out)
{
    vlmd_safetensors *src = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen3_moe", "model.safetensors"),
                                            &src, NULL), VLMD_OK);
    const int64_t E = mc->text.num_experts, H = mc->text.hidden_size,
                  I = mc->text.moe_intermediate_size;
    st_writer w = {.header = json_object()};
    float *gate_up = malloc((size_t)(E * H * 2 * I) * sizeof(float));
    float *down = malloc((size_t)(E * I * H) * sizeof(float));
    for (size_t i = 0; i < vlmd_safetensors_count(src); i++) {
        const vlmd_tensor_view *t = vlmd_safetensors_at(src, i);
        if (strstr(t->name, ".mlp.experts."))
            continue; /* fused below */
        char name[256];
        snprintf(name, sizeof name, "%s", t->name);
        if (strncmp(name, "model.", 6) == 0)
            snprintf(name, sizeof name, "model.language_model.%s", t->name + 6);
        st_add(&w, name, t->ndim, t->shape, t->data);
    }
    for (int64_t l = 0; l < mc->text.num_layers; l++) {
        if (!vlmd_text_layer_is_moe(&mc->text, l))
            continue;
        for (int64_t e = 0; e < E; e++) {
            const char *proj[] = {"gate_proj", "up_proj", "down_proj"};
            const float *part[3];
            for (int p = 0; p < 3; p++) {
                char name[256];
                snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%lld.%s.weight",
                         (long long)l, (long long)e, proj[p]);
                const vlmd_tensor_view *t = vlmd_safetensors_find(src, name);
                cr_assert_not_null(t, "%s", name);
                part[p] = t->data;
            }
            for (int64_t h = 0; h < H; h++)
                for (int64_t r = 0; r < 2 * I; r++) /* gate [I, H], up [I, H] */
                    gate_up[(e * H + h) * 2 * I + r] =
                        r < I ? part[0][r * H + h] : part[1][(r - I) * H + h];
            for (int64_t r = 0; r < I; r++)
                for (int64_t h = 0; h < H; h++) /* down [H, I] */
                    down[(e * I + r) * H + h] = part[2][h * I + r];
        }
        char name[256];
        snprintf(name, sizeof name, "model.language_model.layers.%lld.mlp.experts.gate_up_proj",
                 (long long)l);
        if (!skip || strcmp(skip, name) != 0)
            st_add(&w, name, 3, (int64_t[]){E, H, 2 * I}, gate_up);
        snprintf(name, sizeof name, "model.language_model.layers.%lld.mlp.experts.down_proj",
                 (long long)l);
        bool grown = grow && strcmp(grow, name) == 0;
        if (grown) /* one more expert's worth of rows: the shape is all that is read */
            down = realloc(down, (size_t)((E + 1) * I * H) * sizeof(float));
        if (!skip || strcmp(skip, name) != 0)
            st_add(&w, name, 3, (int64_t[]){E + grown, I, H}, down);
    }
    free(gate_up);
    free(down);
    vlmd_safetensors_close(src);
    return st_open(&w, out);
}

/* Qwen3-VL-MoE's fused experts, transposed at load into the op's layout,
 * give the per-expert checkpoint's logits (the reference's, within 1e-4);
 * a missing or mis-shaped fused tensor is named. */
Test(lm, fused_experts_as_qwen3_vl_moe_publishes_them)
{
    fixture f;
    open_fixture(&f, "qwen3_moe", "model.safetensors");
    vlmd_safetensors *st = NULL;
    char *image = fused_moe_checkpoint(&f.mc, NULL, NULL, &st);
    lm_model *m = NULL;
    vlmd_error err = {0};
    uint64_t bytes = 0, per_expert = 0;
    cr_assert_eq(lm_weight_bytes(f.b, &f.mc, st, &bytes, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors *orig = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen3_moe", "model.safetensors"),
                                            &orig, NULL), VLMD_OK);
    cr_assert_eq(lm_weight_bytes(f.b, &f.mc, orig, &per_expert, &err), VLMD_OK);
    vlmd_safetensors_close(orig);
    cr_expect_eq(bytes, per_expert, "the same weights either way");
    cr_assert_eq(lm_load(f.b, &f.mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    free(image);

    json_t *ids_j = json_object_get(json_array_get(json_object_get(f.json, "cases"), 1),
                                    "input_ids");
    int n = (int)json_array_size(ids_j), V = (int)lm_vocab_size(m);
    int32_t ids[256], pos[3 * 256], slots[256], rows[256];
    cr_assert_leq(n, 256);
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
        slots[i] = rows[i] = i;
        for (int r = 0; r < 3; r++)
            pos[r * n + i] = i;
    }
    lm_kv *kv = NULL;
    lm_workspace *ws = NULL;
    cr_assert_eq(lm_kv_create(m, n, &kv, NULL), VLMD_OK);
    cr_assert_eq(lm_workspace_create(m, n, n, n, &ws, NULL), VLMD_OK);
    float *logits = malloc((size_t)n * V * sizeof *logits);
    vlmd_attn_seq seq = {0, n, n, slots};
    lm_batch bt = {n, ids, pos, slots, &seq, 1, rows, n, NULL, 0};
    cr_assert_eq(lm_forward(m, kv, ws, &bt, logits, &err), VLMD_OK, "%s", err.msg);
    const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, "case1.logits");
    double rel = test_rel_error(logits, lt->data, (size_t)n * V);
    cr_expect_lt(rel, 1e-4, "fused experts: relative error %.3g", rel);
    free(logits);
    lm_workspace_free(m, ws);
    lm_kv_free(m, kv);
    lm_free(m);

    char *bad = fused_moe_checkpoint(&f.mc, "model.language_model.layers.2.mlp.experts.gate_up_proj",
                                     NULL, &st);
    cr_expect_eq(lm_load(f.b, &f.mc, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "missing tensor model.language_model.layers.2.mlp.experts.0."
                              "gate_proj.weight") &&
                  strstr(err.msg, "(or the fused model.language_model.layers.2.mlp.experts."
                                  "gate_up_proj)"), "%s", err.msg);
    vlmd_safetensors_close(st);
    free(bad);
    bad = fused_moe_checkpoint(&f.mc, NULL, "model.language_model.layers.1.mlp.experts.down_proj",
                               &st);
    cr_expect_eq(lm_weight_bytes(f.b, &f.mc, st, &bytes, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "layers.1.mlp.experts.down_proj has shape [9, 64, 128], expected "
                              "[8, 64, 128]"), "%s", err.msg);
    cr_expect_eq(lm_load(f.b, &f.mc, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect_null(m);
    vlmd_safetensors_close(st);
    free(bad);
    close_fixture(&f);
}

/* The qwen3_5_moe fixture with its experts one tensor each
 * (mlp.experts.E.{gate,up,down}_proj.weight [out, in]), as the Qwen3.5 /
 * 3.6 FP8 releases publish them: the same weights and logits as fused. */
Test(lm, qwen3_5_moe_experts_one_tensor_each_as_the_fp8_releases)
{
    fixture f;
    open_fixture(&f, "qwen3_5_moe", "model.safetensors");
    vlmd_safetensors *src = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen3_5_moe", "model.safetensors"),
                                            &src, NULL), VLMD_OK);
    const int64_t E = f.mc.text.num_experts, H = f.mc.text.hidden_size,
                  I = f.mc.text.moe_intermediate_size;
    st_writer w = {.header = json_object()};
    for (size_t i = 0; i < vlmd_safetensors_count(src); i++) {
        const vlmd_tensor_view *t = vlmd_safetensors_at(src, i);
        const char *at = strstr(t->name, ".mlp.experts.");
        if (!at) {
            st_add(&w, t->name, t->ndim, t->shape, t->data);
            continue;
        }
        char base[256];
        snprintf(base, sizeof base, "%.*s.mlp.experts.", (int)(at - t->name), t->name);
        bool gate_up = strstr(at, "gate_up_proj") != NULL;
        for (int64_t e = 0; e < E; e++) {
            char name[320];
            const float *x = t->data;
            if (gate_up) { /* [E, 2I, H]: gate rows, then up rows */
                snprintf(name, sizeof name, "%s%lld.gate_proj.weight", base, (long long)e);
                st_add(&w, name, 2, (int64_t[]){I, H}, x + e * 2 * I * H);
                snprintf(name, sizeof name, "%s%lld.up_proj.weight", base, (long long)e);
                st_add(&w, name, 2, (int64_t[]){I, H}, x + e * 2 * I * H + I * H);
            } else { /* [E, H, I] */
                snprintf(name, sizeof name, "%s%lld.down_proj.weight", base, (long long)e);
                st_add(&w, name, 2, (int64_t[]){H, I}, x + e * H * I);
            }
        }
    }
    vlmd_safetensors *st = NULL;
    char *image = st_open(&w, &st);
    uint64_t split = 0, fused = 0;
    vlmd_error err = {0};
    cr_assert_eq(lm_weight_bytes(f.b, &f.mc, st, &split, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_weight_bytes(f.b, &f.mc, src, &fused, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(split, fused, "the same weights either way");
    lm_model *m = NULL;
    cr_assert_eq(lm_load(f.b, &f.mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    int n, V = (int)lm_vocab_size(m);
    float *logits = case_logits(m, &f, 1, &n);
    double rel = test_rel_error(logits, vlmd_safetensors_find(f.ref, "case1.logits")->data,
                                (size_t)n * V);
    cr_expect_lt(rel, 1e-4, "experts one tensor each: relative error %.3g", rel);
    free(logits);
    lm_free(m);
    vlmd_safetensors_close(st);
    vlmd_safetensors_close(src);
    free(image);
    close_fixture(&f);
}

/* Qwen3's own tensors are checked as Qwen2's: a q/k norm, a router or an
 * expert missing or mis-shaped is named with its shapes. */
Test(lm, missing_and_misshaped_qwen3_tensors_are_named)
{
    fixture f;
    open_fixture(&f, "qwen3_moe", "model.safetensors");
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen3_moe", "model.safetensors"),
                                            &st, NULL), VLMD_OK);
    lm_model *m = NULL;
    vlmd_error err = {0};
    vlmd_model_config wrong = f.mc;
    wrong.text.head_dim = 16, wrong.text.num_heads *= 2, wrong.text.num_kv_heads *= 2;
    cr_expect_eq(lm_load(f.b, &wrong, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "model.layers.0.self_attn.q_norm.weight has shape [32], expected "
                              "[16]"), "%s", err.msg);
    wrong = f.mc;
    wrong.text.num_experts = 9;
    cr_expect_eq(lm_load(f.b, &wrong, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "model.layers.1.mlp.gate.weight has shape [8, 128], expected "
                              "[9, 128]"), "%s", err.msg);
    wrong = f.mc;
    wrong.text.moe_intermediate_size = 32;
    cr_expect_eq(lm_load(f.b, &wrong, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "model.layers.1.mlp.experts.0.gate_proj.weight has shape "
                              "[64, 128], expected [32, 128]"), "%s", err.msg);
    wrong = f.mc;
    wrong.text.mlp_only_layers[0] = 0; /* layer 0 a MoE layer: it has no experts */
    cr_expect_eq(lm_load(f.b, &wrong, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "missing tensor model.layers.0.mlp.gate.weight"), "%s", err.msg);
    cr_expect_null(m);
    vlmd_safetensors_close(st);
    close_fixture(&f);
}

/* ---- the stress's worst-case routing ------------------------------------------------- */

/* With worst-case routing on, a MoE model's step sends every token to
 * experts 0..k-1 (its logits are not the model's) and is counted; off
 * again, the step is the model's own (the reference logits). Dense
 * models count nothing. */
Test(lm, worst_case_routing_is_on_only_while_asked)
{
    /* the softmax router, the sigmoid one (GLM: its shared expert runs too), a dense model */
    const char *models[] = {"qwen3_moe", "glm4_moe", "qwen3"};
    for (int mi = 0; mi < 3; mi++) {
        fixture f;
        open_fixture(&f, models[mi], "model.safetensors");
        json_t *ids_j = json_object_get(json_array_get(json_object_get(f.json, "cases"), 0),
                                        "input_ids");
        int n = (int)json_array_size(ids_j), V = (int)lm_vocab_size(f.m);
        int32_t ids[256], pos[3 * 256], slots[256], rows[256];
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
            slots[i] = rows[i] = i;
            for (int r = 0; r < 3; r++)
                pos[r * n + i] = i;
        }
        lm_kv *kv = NULL;
        lm_workspace *ws = NULL;
        cr_assert_eq(lm_kv_create(f.m, n, &kv, NULL), VLMD_OK);
        cr_assert_eq(lm_workspace_create(f.m, n, n, n, &ws, NULL), VLMD_OK);
        float *logits = malloc((size_t)n * V * sizeof *logits);
        vlmd_attn_seq seq = {0, n, n, slots};
        lm_batch bt = {n, ids, pos, slots, &seq, 1, rows, n, NULL, 0};
        const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, "case0.logits");
        bool moe = mi < 2;
        for (int on = 1; on >= 0; on--) {
            lm_set_worst_case_routing(ws, on);
            uint64_t before = lm_worst_case_steps(f.m);
            cr_assert_eq(lm_forward(f.m, kv, ws, &bt, logits, NULL), VLMD_OK);
            cr_expect_eq(lm_worst_case_steps(f.m) - before, (uint64_t)(on && moe));
            double rel = test_rel_error(logits, lt->data, (size_t)n * V);
            if (on && moe)
                cr_expect_gt(rel, 1e-2, "worst-case routing is not the model's: %.3g", rel);
            else
                cr_expect_lt(rel, 1e-4, "%s, worst case %d: %.3g", models[mi], on, rel);
        }
        free(logits);
        lm_workspace_free(f.m, ws);
        lm_kv_free(f.m, kv);
        close_fixture(&f);
    }
}
