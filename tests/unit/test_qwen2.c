/* test_qwen2.c - the Qwen2 and Qwen3 text forward on the CPU backend
 * against the fixtures (Qwen2 family: computed by Hugging Face transformers;
 * Qwen3, Qwen3-MoE, Qwen3-VL: by the validated port, see their README):
 * logits at every prompt position within 1e-4 relative error with F32
 * weights, and the 12-token greedy continuation identical. With BF16
 * weights the logits are compared to the same F32 reference (there is no
 * BF16 one): rounding the weights alone moves them by 0.65e-2 to 1.16e-2
 * (measured; the widening is exact and the F32 path is within 1e-4), so the
 * bound there is 2e-2. Qwen3-MoE with BF16 weights is compared with the
 * F32 model's expert choices (see the tape below): its own choices differ
 * where bf16 rounding reorders two router logits, which moves its logits
 * by 2.7e-2 to 6.3e-2 (measured; the fixture README says 3e-2 to 6e-2), and
 * with the F32 choices 0.9e-2 to 1.01e-2, as the dense models. The
 * Qwen2-VL image cases take the reference vision embeddings at their pad
 * tokens; Qwen3-VL's also need the DeepStack features (not given here), so
 * its text cases run. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "qwen2.h"
#include "test_support.h"

/* ---- replaying one model's expert choices in another ------------------------------ */

/* The CPU's op table with moe_route taped: recording keeps each call's
 * expert ids; replaying makes the next call take the recorded ids in the
 * same order, weighted by its own router's probabilities of them. The
 * F32 model records a step, then the BF16 model replays it. (Ops have no
 * context pointer: one tape per process.) */
typedef enum tape_mode { TAPE_OFF, TAPE_RECORD, TAPE_REPLAY } tape_mode;
static struct {
    const vlmd_op_table *base;
    vlmd_op_table table;
    tape_mode mode;
    int32_t *ids;
    size_t len, cap, at;
} tape;

static void taped_route(vlmd_backend *b, int32_t *ids, float *weights, const void *logits_,
                        int n, int n_experts, int k, bool renormalize, bool worst_case)
{
    tape.base->moe_route(b, ids, weights, logits_, n, n_experts, k, renormalize, worst_case);
    size_t count = (size_t)n * k;
    if (tape.mode == TAPE_RECORD) {
        if (tape.len + count > tape.cap) {
            tape.cap = 2 * (tape.len + count);
            tape.ids = realloc(tape.ids, tape.cap * sizeof *tape.ids);
            cr_assert_not_null(tape.ids);
        }
        memcpy(tape.ids + tape.len, ids, count * sizeof *ids);
        tape.len += count;
        return;
    }
    if (tape.mode != TAPE_REPLAY)
        return;
    cr_assert_leq(tape.at + count, tape.len, "the replay follows the recording");
    const float *logits = logits_; /* the CPU's activations are fp32 host memory */
    for (int t = 0; t < n; t++) {
        const float *row = logits + (size_t)t * n_experts;
        float mx = row[0], total = 0;
        for (int e = 1; e < n_experts; e++)
            mx = row[e] > mx ? row[e] : mx;
        double sum = 0;
        for (int e = 0; e < n_experts; e++)
            sum += exp((double)(row[e] - mx));
        for (int j = 0; j < k; j++) {
            int32_t id = tape.ids[tape.at++];
            ids[(size_t)t * k + j] = id;
            weights[(size_t)t * k + j] = (float)(exp((double)(row[id] - mx)) / sum);
            total += weights[(size_t)t * k + j];
        }
        for (int j = 0; renormalize && j < k; j++)
            weights[(size_t)t * k + j] /= total;
    }
}

/* Models loaded on b after this use the taped moe_route. */
static void tape_install(vlmd_backend *b)
{
    tape.base = vlmd_backend_ops(b);
    tape.table = *tape.base;
    tape.table.moe_route = taped_route;
    b->op_table = &tape.table;
}

/* ---- fixtures ---------------------------------------------------------------------- */

typedef struct fixture {
    vlmd_model_config mc;
    vlmd_backend *b;
    qwen2_model *m;
    qwen2_model *router;        /* whose expert choices m replays (NULL: its own) */
    vlmd_safetensors *ref;
    json_t *json;
} fixture;

static qwen2_model *load_model(fixture *f, const char *model, const char *weights)
{
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    qwen2_model *m = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, weights), &st, &err), VLMD_OK,
                 "%s", err.msg);
    cr_assert_eq(qwen2_load(f->b, &f->mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st); /* the model holds its own copy */
    return m;
}

/* false when the device is not there (only "cuda" may be missing). routing_from: the
 * weights whose expert choices the model replays (CPU only), or NULL. */
static bool open_fixture_routed(fixture *f, const char *model, const char *weights,
                                const char *device, const char *routing_from)
{
    memset(f, 0, sizeof *f);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &f->mc, &err), VLMD_OK, "%s", err.msg);
    if (!test_backend_open(device, &f->b))
        return false;
    if (routing_from) {
        cr_assert_str_eq(device, "cpu");
        tape_install(f->b);
        f->router = load_model(f, model, routing_from);
    }
    f->m = load_model(f, model, weights);
    f->ref = test_reference_tensors(model);
    f->json = test_reference_json(model);
    return true;
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
    qwen2_free(f->m);
    qwen2_free(f->router);
    vlmd_safetensors_close(f->ref);
    vlmd_backend_destroy(f->b);
    json_decref(f->json);
    free(tape.ids);
    memset(&tape, 0, sizeof tape);
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

/* A model and its cache and workspace; with a router model beside it, the
 * router's own. */
typedef struct runner {
    fixture *f;
    qwen2_kv *kv, *router_kv;
    qwen2_workspace *ws, *router_ws;
} runner;

static void runner_open(runner *r, fixture *f, int max)
{
    vlmd_error err = {0};
    *r = (runner){.f = f};
    cr_assert_eq(qwen2_kv_create(f->m, max, &r->kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(qwen2_workspace_create(f->m, max, max, max, &r->ws, &err), VLMD_OK, "%s",
                 err.msg);
    if (!f->router)
        return;
    cr_assert_eq(qwen2_kv_create(f->router, max, &r->router_kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(qwen2_workspace_create(f->router, max, max, max, &r->router_ws, &err), VLMD_OK,
                 "%s", err.msg);
}

static void runner_close(runner *r)
{
    qwen2_workspace_free(r->f->m, r->ws);
    qwen2_kv_free(r->f->m, r->kv);
    if (r->f->router) {
        qwen2_workspace_free(r->f->router, r->router_ws);
        qwen2_kv_free(r->f->router, r->router_kv);
    }
}

/* One step of the model (the router model's first, its expert choices taped). */
static void runner_forward(runner *r, const qwen2_batch *bt, float *logits)
{
    vlmd_error err = {0};
    if (r->f->router) {
        tape.mode = TAPE_RECORD;
        tape.len = 0;
        cr_assert_eq(qwen2_forward(r->f->router, r->router_kv, r->router_ws, bt, NULL, &err),
                     VLMD_OK, "%s", err.msg);
        tape.mode = TAPE_REPLAY;
        tape.at = 0;
    }
    cr_assert_eq(qwen2_forward(r->f->m, r->kv, r->ws, bt, logits, &err), VLMD_OK, "%s", err.msg);
    if (r->f->router)
        cr_assert_eq(tape.at, tape.len, "every recorded choice replayed");
    tape.mode = TAPE_OFF;
}

/* What check_model runs: every case of a fixture model on a device. */
typedef struct model_check {
    const char *device, *model, *weights;
    double tol;
    greedy_check greedy;
    bool text_only;             /* only the cases without images */
    const char *routing_from;   /* MoE: the weights whose expert choices are replayed */
} model_check;

/* Runs every case of a model: prefill logits, then greedy decoding. */
static void check_model_with(const model_check *mk)
{
    fixture f;
    if (!open_fixture_routed(&f, mk->model, mk->weights, mk->device, mk->routing_from))
        return;
    const char *device = mk->device, *model = mk->model, *weights = mk->weights;
    const int V = (int)qwen2_vocab_size(f.m), max = 256;
    runner run;
    runner_open(&run, &f, max);
    size_t ci;
    json_t *c;
    int checked = 0;
    json_array_foreach(json_object_get(f.json, "cases"), ci, c)
    {
        if (mk->text_only && (json_object_get(c, "image") || json_object_get(c, "images")))
            continue;
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
        qwen2_embed_run image = {0};
        snprintf(name, sizeof name, "case%zu.vision_embeds", ci);
        const vlmd_tensor_view *ve = vlmd_safetensors_find(f.ref, name);
        if (ve) {
            cr_assert_eq(ve->shape[1], qwen2_hidden_size(f.m));
            int32_t pad = (int32_t)f.mc.image_token_id;
            while (image.row < n && ids[image.row] != pad)
                image.row++;
            image.n_rows = (int32_t)ve->shape[0];
            image.data = ve->data;
            for (int i = 0; i < image.n_rows; i++)
                cr_assert_eq(ids[image.row + i], pad, "the pads run for the image's tokens");
        }
        float *logits = malloc((size_t)n * V * sizeof *logits);
        vlmd_attn_seq seq = {0, n, n, slots};
        qwen2_batch bt = {n, ids, pos, slots, &seq, 1, rows, n, &image, ve ? 1 : 0};
        runner_forward(&run, &bt, logits);

        snprintf(name, sizeof name, "case%zu.logits", ci);
        const vlmd_tensor_view *lt = vlmd_safetensors_find(f.ref, name);
        cr_assert_not_null(lt);
        cr_assert_eq(vlmd_tensor_numel(lt), (int64_t)n * V);
        const float *ref = lt->data;
        double rel = test_rel_error(logits, ref, (size_t)n * V);
        if (strcmp(device, "cpu") != 0) /* the number the CUDA issue reports */
            fprintf(stderr, "%s %s %s case %zu: logits relative error %.4g\n", device, model,
                    weights, ci, rel);
        cr_expect_lt(rel, mk->tol, "%s %s case %zu: relative error %.3g", model, weights, ci,
                     rel);

        {
            json_t *want = json_object_get(c, "greedy_continuation");
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
                qwen2_batch step = {1, &id, p, &slot, &one, 1, &row, 1, NULL, 0};
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
    cr_expect_geq(checked, f.mc.has_vision && !mk->text_only ? 4 : 2, "%s: every case ran",
                  model);
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

Test(qwen2, qwen2_f32) { check_model("qwen2", "model.safetensors", 1e-4, GREEDY_EXACT); }
Test(qwen2, qwen2_bf16)
{
    check_model("qwen2", "model.bf16.safetensors", 2e-2, GREEDY_UNTIL_NEAR_TIE);
}
Test(qwen2, qwen2_vl_text_f32) { check_model("qwen2_vl", "model.safetensors", 1e-4, GREEDY_EXACT); }
Test(qwen2, qwen2_vl_text_bf16)
{
    check_model("qwen2_vl", "model.bf16.safetensors", 2e-2, GREEDY_UNTIL_NEAR_TIE);
}
Test(qwen2, qwen2_5_vl_text_f32)
{
    check_model("qwen2_5_vl", "model.safetensors", 1e-4, GREEDY_EXACT);
}
Test(qwen2, qwen2_5_vl_text_bf16)
{
    check_model("qwen2_5_vl", "model.bf16.safetensors", 2e-2, GREEDY_UNTIL_NEAR_TIE);
}

/* The Qwen3 generation, on the CPU. */
#define F32 "model.safetensors"
#define BF16 "model.bf16.safetensors"
static const model_check qwen3_checks[] = {
    {"cpu", "qwen3", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "qwen3", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, NULL},
    {"cpu", "qwen3_moe", F32, 1e-4, GREEDY_EXACT, false, NULL},
    {"cpu", "qwen3_moe", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, false, F32},
    /* the text model of Qwen3-VL (interleaved M-RoPE, model.language_model.*) */
    {"cpu", "qwen3_vl", F32, 1e-4, GREEDY_EXACT, true, NULL},
    {"cpu", "qwen3_vl", BF16, 2e-2, GREEDY_UNTIL_NEAR_TIE, true, NULL},
};
Test(qwen2, qwen3_f32) { check_model_with(&qwen3_checks[0]); }
Test(qwen2, qwen3_bf16) { check_model_with(&qwen3_checks[1]); }
Test(qwen2, qwen3_moe_f32) { check_model_with(&qwen3_checks[2]); }
Test(qwen2, qwen3_moe_bf16_with_f32_routing) { check_model_with(&qwen3_checks[3]); }
Test(qwen2, qwen3_vl_text_f32) { check_model_with(&qwen3_checks[4]); }
Test(qwen2, qwen3_vl_text_bf16) { check_model_with(&qwen3_checks[5]); }

/* Through the CUDA backend (bf16 weights and activations): where a GPU is
 * visible, the logits of every text case of every model against the
 * reference and the greedy continuation up to any near tie; elsewhere the
 * backend's clear refusal. A Qwen3 model joins the list once the CUDA table
 * has its ops (qwen2_backend_check; until then its load is refused, below). */
Test(qwen2, cuda_bf16_all_models)
{
    const char *models[] = {"qwen2", "qwen2_vl", "qwen2_5_vl"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        check_model_on("cuda", models[i], BF16, 3e-2, GREEDY_UNTIL_NEAR_TIE);
}

Test(qwen2, missing_and_misshaped_tensors_are_named)
{
    fixture f;
    open_fixture(&f, "qwen2", "model.safetensors");
    vlmd_model_config wrong = f.mc;
    wrong.text.intermediate_size += 1;
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen2", "model.safetensors"), &st,
                                            NULL), VLMD_OK);
    qwen2_model *m = NULL;
    vlmd_error err = {0};
    cr_expect_eq(qwen2_load(f.b, &wrong, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "mlp.gate_proj.weight has shape [256, 128], expected [257, 128]"),
              "%s", err.msg);
    cr_expect_null(m);
    cr_expect_eq(vlmd_backend_allocated_bytes(f.b) > 0, true, "the good model's weights");
    vlmd_model_config more = f.mc;
    more.text.num_layers += 1;
    cr_expect_eq(qwen2_load(f.b, &more, st, &m, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "missing tensor model.layers.3."), "%s", err.msg);
    vlmd_safetensors_close(st);
    close_fixture(&f);
}

/* A prompt prefilled in chunks (each attending to the chunks before it in
 * the KV cache) gives the logits of the one-shot prefill: within 1e-4 of the
 * reference for chunks of 7, 64 and 4096 tokens (F32, CPU). */
Test(qwen2, chunked_prefill_matches_one_shot)
{
    const char *models[] = {"qwen2", "qwen2_vl"};
    for (int mi = 0; mi < 2; mi++) {
        fixture f;
        open_fixture(&f, models[mi], "model.safetensors");
        const int V = (int)qwen2_vocab_size(f.m), max = 256;
        qwen2_kv *kv = NULL;
        qwen2_workspace *ws = NULL;
        cr_assert_eq(qwen2_kv_create(f.m, max, &kv, NULL), VLMD_OK);
        cr_assert_eq(qwen2_workspace_create(f.m, max, max, max, &ws, NULL), VLMD_OK);
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
                qwen2_batch bt = {len, ids + start, pos, slots + start, &seq, 1, rows, len,
                                  NULL, 0};
                vlmd_error err = {0};
                cr_assert_eq(qwen2_forward(f.m, kv, ws, &bt, logits + (size_t)start * V, &err),
                             VLMD_OK, "%s", err.msg);
            }
            double rel = test_rel_error(logits, ref, (size_t)n * V);
            cr_expect_lt(rel, 1e-4, "%s, chunks of %d: relative error %.3g", models[mi],
                         chunks[c], rel);
        }
        free(logits);
        qwen2_workspace_free(f.m, ws);
        qwen2_kv_free(f.m, kv);
        close_fixture(&f);
    }
}

/* A decode batch through the captured graphs (the CPU replays the call)
 * gives the eager logits: 11 sequences of different lengths padded to the
 * graph of 12 (sizes 1, 2, 4, 8 and the largest, 12), whose padding rows
 * write the pad slot and leave every real slot as eager left it. */
Test(qwen2, decode_graphs_pad_a_batch_and_give_the_eager_logits)
{
    fixture f;
    open_fixture(&f, "qwen2", "model.safetensors");
    enum { SEQS = 11, MAX = 12, CTX = 9, SLOTS = SEQS * CTX };
    const int V = (int)qwen2_vocab_size(f.m);
    qwen2_kv *kv[2];
    qwen2_workspace *ws[2];
    vlmd_error err = {0};
    int32_t ids[SLOTS], pos[3 * SLOTS], slots[SLOTS], rows[SLOTS];
    vlmd_attn_seq seqs[SEQS];
    float *logits[2] = {malloc((size_t)SEQS * V * sizeof(float)),
                        malloc((size_t)SEQS * V * sizeof(float))};
    for (int g = 0; g < 2; g++) {
        cr_assert_eq(qwen2_kv_create(f.m, SLOTS, &kv[g], &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(qwen2_workspace_create(f.m, SLOTS, MAX, CTX, &ws[g], &err), VLMD_OK, "%s",
                     err.msg);
        if (g) {
            cr_assert_eq(qwen2_capture_decode(f.m, kv[g], ws[g], &err), VLMD_OK, "%s", err.msg);
            cr_expect_eq(qwen2_decode_graph_count(ws[g]), 5);
            cr_expect_eq(qwen2_decode_graph_max(ws[g]), MAX);
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
        qwen2_batch prefill = {n, step_ids, step_pos, step_slots, seqs, SEQS, rows, 0, NULL, 0};
        cr_assert_eq(qwen2_forward(f.m, kv[g], ws[g], &prefill, NULL, &err), VLMD_OK, "%s",
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
        qwen2_batch decode = {SEQS, step_ids, step_pos, step_slots, seqs, SEQS, rows, SEQS,
                              NULL, 0};
        cr_assert_eq(qwen2_forward(f.m, kv[g], ws[g], &decode, logits[g], &err), VLMD_OK, "%s",
                     err.msg);
    }
    cr_expect_eq(qwen2_decode_graph_steps(ws[0]), 0);
    cr_expect_eq(qwen2_decode_graph_steps(ws[1]), 1, "the decode step replayed the graph of 12");
    double rel = test_rel_error(logits[1], logits[0], (size_t)SEQS * V);
    cr_expect_lt(rel, 1e-6, "graph logits against eager: %g", rel);
    for (int g = 0; g < 2; g++) {
        qwen2_workspace_free(f.m, ws[g]);
        qwen2_kv_free(f.m, kv[g]);
        free(logits[g]);
    }
    close_fixture(&f);
}

