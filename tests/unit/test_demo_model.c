/* test_demo_model.c - the generated demo model is a complete, consistent
 * Qwen2-VL checkpoint in Hugging Face layout, reproducible from its seed:
 *   - config.json loads and its dimensions and token ids agree;
 *   - model.safetensors has every tensor the fixture checkpoint has (layer
 *     and block names mapped by index) with the shape the demo config
 *     implies, the shape rule itself checked on the fixture first; the
 *     tensors tile the data section; the weights look like N(0, 0.02);
 *   - tokenizer.json is byte-level BPE laid out like Qwen's: the fixture's
 *     256 byte symbols, merge i makes token 256 + i, the fixture's specials;
 *     vlmd's tokenizer loads it and round-trips text, and vlmd's forward
 *     runs on the weights;
 *   - same seed same bytes, a second run is a no-op, a foreign model is
 *     refused, an incomplete one is redone; the command's exit codes. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "chat_template.h"
#include "demo_model.h"
#include "model_config.h"
#include "lm.h"
#include "safetensors.h"
#include "test_support.h"
#include "tokenizer.h"

static const char *const model_files[] = {
    "config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
    "tokenizer.json", "tokenizer_config.json", ".vlmd-demo-model",
};
#define N_MODEL_FILES (sizeof model_files / sizeof model_files[0])

/* ---- helpers ------------------------------------------------------------- */

static char *fresh_dir(void)
{
    char *dir = strdup("/tmp/vlmd-demo-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static char *make_model(uint64_t seed)
{
    char *dir = fresh_dir();
    bool unchanged = true;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_demo_model_write(dir, seed, &unchanged, &err), VLMD_OK, "%s", err.msg);
    cr_expect_not(unchanged);
    return dir;
}

static const char *path_in(const char *dir, const char *name)
{
    static char p[4096];
    int n = snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert(n > 0 && (size_t)n < sizeof p, "path too long");
    return p;
}

/* Removes what the generator may have written, then dir; frees dir. */
static void remove_dir(char *dir)
{
    for (size_t i = 0; i < N_MODEL_FILES; i++)
        unlink(path_in(dir, model_files[i]));
    rmdir(dir);
    free(dir);
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    cr_assert_not_null(j, "%s: %s", path, e.text);
    return j;
}

static json_int_t int_at(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_integer(v), "%s is an integer", key);
    return json_integer_value(v);
}

static void read_all(const char *path, vlmd_buf *out)
{
    cr_assert_eq(vlmd_read_file(path, 1u << 30, out, NULL), VLMD_OK, "%s", path);
}

static bool same_file(const char *a, const char *b)
{
    vlmd_buf x = VLMD_BUF_INIT, y = VLMD_BUF_INIT;
    read_all(a, &x);
    read_all(b, &y);
    bool same = x.len == y.len && memcmp(x.data, y.data, x.len) == 0;
    vlmd_buf_free(&x);
    vlmd_buf_free(&y);
    return same;
}

static void load_config(const char *dir, vlmd_model_config *mc)
{
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(dir, mc, &err), VLMD_OK, "%s", err.msg);
}

static vlmd_safetensors *open_weights(const char *path)
{
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_file(path, &st, &err), VLMD_OK, "%s", err.msg);
    return st;
}

/* ---- config -------------------------------------------------------------- */

Test(demo_model, config_dimensions_and_token_ids_agree)
{
    char *dir = make_model(0);
    vlmd_model_config mc;
    load_config(dir, &mc);
    const vlmd_text_config *t = &mc.text;
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN2_VL);
    cr_expect_eq(t->head_dim * t->num_heads, t->hidden_size);
    cr_expect_eq(t->num_heads % t->num_kv_heads, 0, "GQA groups are whole");
    cr_expect_eq(t->n_mrope_section, 3);
    cr_expect_eq(2 * (t->mrope_section[0] + t->mrope_section[1] + t->mrope_section[2]),
                 t->head_dim, "M-RoPE sections cover head_dim / 2");
    cr_expect_not(t->tie_word_embeddings);
    cr_expect(mc.has_vision);
    cr_expect_eq(mc.vision.hidden_size, t->hidden_size, "the merger feeds the LLM");
    cr_expect_eq(mc.vision.embed_dim % mc.vision.num_heads, 0);
    cr_expect_eq((mc.vision.embed_dim / mc.vision.num_heads) % 4, 0, "2-D rotary halves");

    /* The nested shape docs/ARCHITECTURE.md names: text_config with rope_parameters. */
    json_t *cfg = load_json(path_in(dir, "config.json"));
    json_t *text = json_object_get(cfg, "text_config");
    cr_assert(json_is_object(text));
    cr_expect(json_is_object(json_object_get(text, "rope_parameters")));
    cr_expect_eq(json_object_get(cfg, "rope_scaling"), NULL);

    /* Every id is a special token of the tokenizer, inside vocab_size. */
    json_t *tok = load_json(path_in(dir, "tokenizer.json"));
    json_int_t n_vocab = (json_int_t)json_object_size(
        json_object_get(json_object_get(tok, "model"), "vocab"));
    json_int_t n_total = n_vocab + (json_int_t)json_array_size(json_object_get(tok, "added_tokens"));
    cr_expect_geq(t->vocab_size, n_total, "vocab_size %lld holds %lld tokens",
                  (long long)t->vocab_size, (long long)n_total);
    cr_expect_lt(t->vocab_size, n_total + 128, "vocab_size is padded, not inflated");
    const json_int_t ids[] = {t->bos_token_id, t->eos_token_id, mc.image_token_id,
                              mc.vision_start_token_id, mc.vision_end_token_id,
                              int_at(cfg, "video_token_id")};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        cr_expect(ids[i] >= n_vocab && ids[i] < n_total, "id %lld is a special token",
                  (long long)ids[i]);
    json_t *gen = load_json(path_in(dir, "generation_config.json"));
    cr_expect_eq(int_at(gen, "bos_token_id"), t->bos_token_id);
    cr_expect_eq(int_at(gen, "eos_token_id"), t->eos_token_id);

    json_t *pre = load_json(path_in(dir, "preprocessor_config.json"));
    cr_expect_eq(int_at(pre, "patch_size"), mc.vision.patch_size);
    cr_expect_eq(int_at(pre, "merge_size"), mc.vision.spatial_merge_size);
    cr_expect_eq(int_at(pre, "temporal_patch_size"), mc.vision.temporal_patch_size);
    json_t *size = json_object_get(pre, "size");
    cr_expect_eq(int_at(size, "shortest_edge"), int_at(pre, "min_pixels"));
    cr_expect_eq(int_at(size, "longest_edge"), int_at(pre, "max_pixels"));
    cr_expect_eq(json_array_size(json_object_get(pre, "image_mean")), 3);
    cr_expect_eq(json_array_size(json_object_get(pre, "image_std")), 3);
    json_decref(pre);
    json_decref(gen);
    json_decref(tok);
    json_decref(cfg);
    remove_dir(dir);
}

/* ---- weights ------------------------------------------------------------- */

/* The shape a Qwen2-VL tensor has under mc, from the architecture alone;
 * false for a name it does not know. */
static bool expected_shape(const vlmd_model_config *mc, const char *name, int *ndim,
                           int64_t dims[5])
{
    const vlmd_text_config *t = &mc->text;
    const vlmd_vision_config *v = &mc->vision;
    const int64_t H = t->hidden_size, V = t->vocab_size, I = t->intermediate_size;
    const int64_t Q = t->num_heads * t->head_dim, KV = t->num_kv_heads * t->head_dim;
    const int64_t E = v->embed_dim, M = v->intermediate_size;
    const int64_t MERGED = E * v->spatial_merge_size * v->spatial_merge_size;
    const struct {
        const char *name;
        int ndim;
        int64_t d[5];
    } rules[] = {
        {"model.embed_tokens.weight", 2, {V, H}},
        {"lm_head.weight", 2, {V, H}},
        {"model.norm.weight", 1, {H}},
        {"L.input_layernorm.weight", 1, {H}},
        {"L.post_attention_layernorm.weight", 1, {H}},
        {"L.self_attn.q_proj.weight", 2, {Q, H}},
        {"L.self_attn.q_proj.bias", 1, {Q}},
        {"L.self_attn.k_proj.weight", 2, {KV, H}},
        {"L.self_attn.k_proj.bias", 1, {KV}},
        {"L.self_attn.v_proj.weight", 2, {KV, H}},
        {"L.self_attn.v_proj.bias", 1, {KV}},
        {"L.self_attn.o_proj.weight", 2, {H, Q}},
        {"L.mlp.gate_proj.weight", 2, {I, H}},
        {"L.mlp.up_proj.weight", 2, {I, H}},
        {"L.mlp.down_proj.weight", 2, {H, I}},
        {"visual.patch_embed.proj.weight", 5,
         {E, v->in_channels, v->temporal_patch_size, v->patch_size, v->patch_size}},
        {"B.norm1.weight", 1, {E}},
        {"B.norm1.bias", 1, {E}},
        {"B.norm2.weight", 1, {E}},
        {"B.norm2.bias", 1, {E}},
        {"B.attn.qkv.weight", 2, {3 * E, E}},
        {"B.attn.qkv.bias", 1, {3 * E}},
        {"B.attn.proj.weight", 2, {E, E}},
        {"B.attn.proj.bias", 1, {E}},
        {"B.mlp.fc1.weight", 2, {M, E}},
        {"B.mlp.fc1.bias", 1, {M}},
        {"B.mlp.fc2.weight", 2, {E, M}},
        {"B.mlp.fc2.bias", 1, {E}},
        {"visual.merger.ln_q.weight", 1, {E}},
        {"visual.merger.ln_q.bias", 1, {E}},
        {"visual.merger.mlp.0.weight", 2, {MERGED, MERGED}},
        {"visual.merger.mlp.0.bias", 1, {MERGED}},
        {"visual.merger.mlp.2.weight", 2, {v->hidden_size, MERGED}},
        {"visual.merger.mlp.2.bias", 1, {v->hidden_size}},
    };
    /* "model.layers.N.x" -> "L.x" (N < layers), "visual.blocks.N.x" -> "B.x" (N < depth) */
    char key[128];
    int index, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &index, &used) == 1 && used > 0) {
        if (index < 0 || index >= t->num_layers)
            return false;
        snprintf(key, sizeof key, "L.%s", name + used);
    } else if (sscanf(name, "visual.blocks.%d.%n", &index, &used) == 1 && used > 0) {
        if (index < 0 || index >= v->depth)
            return false;
        snprintf(key, sizeof key, "B.%s", name + used);
    } else {
        snprintf(key, sizeof key, "%s", name);
    }
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (strcmp(rules[i].name, key) == 0) {
            *ndim = rules[i].ndim;
            memcpy(dims, rules[i].d, sizeof rules[i].d);
            return true;
        }
    return false;
}

static void expect_tensor(const vlmd_safetensors *st, const vlmd_model_config *mc,
                          const char *name, const char *which)
{
    const vlmd_tensor_view *tv = vlmd_safetensors_find(st, name);
    cr_assert_not_null(tv, "%s: tensor %s exists", which, name);
    int ndim;
    int64_t dims[5];
    cr_assert(expected_shape(mc, name, &ndim, dims), "%s: %s is a Qwen2-VL tensor", which, name);
    cr_assert_eq(tv->ndim, ndim, "%s: %s rank", which, name);
    for (int d = 0; d < ndim; d++)
        cr_expect_eq(tv->shape[d], dims[d], "%s: %s dim %d is %lld, want %lld", which, name, d,
                     (long long)tv->shape[d], (long long)dims[d]);
}

Test(demo_model, every_fixture_tensor_with_the_shape_the_config_implies)
{
    /* The shape rule is first checked on the reference checkpoint. */
    char fixture_dir[4096];
    snprintf(fixture_dir, sizeof fixture_dir, "%s", test_fixture("qwen2_vl"));
    vlmd_model_config fc;
    load_config(fixture_dir, &fc);
    vlmd_safetensors *ref = open_weights(path_in(fixture_dir, "model.safetensors"));
    for (size_t i = 0; i < vlmd_safetensors_count(ref); i++)
        expect_tensor(ref, &fc, vlmd_safetensors_at(ref, i)->name, "fixture");

    char *dir = make_model(0);
    vlmd_model_config mc;
    load_config(dir, &mc);
    vlmd_safetensors *st = open_weights(path_in(dir, "model.safetensors"));
    size_t expected = 0;
    char name[256];
    for (size_t i = 0; i < vlmd_safetensors_count(ref); i++) {
        const char *rn = vlmd_safetensors_at(ref, i)->name;
        int index, used = 0;
        if (sscanf(rn, "model.layers.%d.%n", &index, &used) == 1 && used > 0) {
            if (index != 0)
                continue; /* layer 0 stands for all */
            for (int64_t l = 0; l < mc.text.num_layers; l++, expected++) {
                snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, rn + used);
                expect_tensor(st, &mc, name, "demo");
            }
        } else if (sscanf(rn, "visual.blocks.%d.%n", &index, &used) == 1 && used > 0) {
            if (index != 0)
                continue;
            for (int64_t b = 0; b < mc.vision.depth; b++, expected++) {
                snprintf(name, sizeof name, "visual.blocks.%lld.%s", (long long)b, rn + used);
                expect_tensor(st, &mc, name, "demo");
            }
        } else {
            expect_tensor(st, &mc, rn, "demo");
            expected++;
        }
    }
    cr_expect_eq(vlmd_safetensors_count(st), expected, "no tensor missing or extra: %zu vs %zu",
                 vlmd_safetensors_count(st), expected);
    for (size_t i = 0; i < vlmd_safetensors_count(st); i++)
        cr_expect_eq(vlmd_safetensors_at(st, i)->dtype, VLMD_DTYPE_BF16, "%s is BF16",
                     vlmd_safetensors_at(st, i)->name);
    vlmd_safetensors_close(st);
    vlmd_safetensors_close(ref);
    remove_dir(dir);
}

Test(demo_model, safetensors_header_and_data_tile_the_file)
{
    char *dir = make_model(0);
    vlmd_buf file = VLMD_BUF_INIT;
    read_all(path_in(dir, "model.safetensors"), &file);
    cr_assert_gt(file.len, 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | (uint8_t)file.data[i];
    cr_assert_eq(hlen % 8, 0, "header padded to a multiple of 8");
    cr_assert_leq(8 + hlen, file.len);
    const char *htext = file.data + 8;
    size_t end = hlen;
    while (end > 0 && htext[end - 1] == ' ')
        end--;
    cr_expect_lt(hlen - end, 8, "padding is under 8 spaces");
    cr_assert_gt(end, 0);
    cr_expect_eq(htext[end - 1], '}', "the JSON ends where the spaces begin");
    json_error_t e;
    json_t *h = json_loadb(htext, end, JSON_REJECT_DUPLICATES, &e);
    cr_assert_not_null(h, "header: %s", e.text);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(h, "__metadata__"),
                                                       "format")), "pt");

    /* In header order, each tensor starts where the one before ended. */
    uint64_t offset = 0;
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(h, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        n++;
        cr_expect_str_eq(json_string_value(json_object_get(val, "dtype")), "BF16", "%s", key);
        uint64_t elems = 1;
        size_t i;
        json_t *d;
        json_array_foreach(json_object_get(val, "shape"), i, d) elems *= (uint64_t)json_integer_value(d);
        json_t *off = json_object_get(val, "data_offsets");
        cr_assert_eq(json_array_size(off), 2, "%s data_offsets", key);
        uint64_t begin = (uint64_t)json_integer_value(json_array_get(off, 0));
        uint64_t stop = (uint64_t)json_integer_value(json_array_get(off, 1));
        cr_expect_eq(begin, offset, "%s starts at %llu, the previous tensor ended at %llu", key,
                     (unsigned long long)begin, (unsigned long long)offset);
        cr_expect_eq(stop - begin, elems * 2, "%s holds its shape in BF16", key);
        offset = stop;
    }
    cr_expect_gt(n, 0);
    cr_expect_eq(8 + hlen + offset, file.len, "the file ends with the last tensor");
    json_decref(h);
    vlmd_buf_free(&file);
    remove_dir(dir);
}

/* Mean and standard deviation of a tensor, widened by vlmd's reader. */
static void tensor_stats(const vlmd_safetensors *st, const char *name, double *mean, double *sd,
                         float *min, float *max)
{
    const vlmd_tensor_view *tv = vlmd_safetensors_find(st, name);
    cr_assert_not_null(tv, "%s", name);
    int64_t n = vlmd_tensor_numel(tv);
    float *x = malloc((size_t)n * sizeof *x);
    cr_assert_eq(vlmd_tensor_to_f32(tv, x, NULL), VLMD_OK);
    double sum = 0, sq = 0;
    *min = *max = x[0];
    for (int64_t i = 0; i < n; i++) {
        sum += x[i];
        sq += (double)x[i] * x[i];
        *min = x[i] < *min ? x[i] : *min;
        *max = x[i] > *max ? x[i] : *max;
    }
    *mean = sum / (double)n;
    *sd = sqrt(sq / (double)n - *mean * *mean);
    free(x);
}

Test(demo_model, weights_are_normal_002_norms_one_biases_zero)
{
    char *dir = make_model(7);
    vlmd_safetensors *st = open_weights(path_in(dir, "model.safetensors"));
    const char *normal[] = {"model.embed_tokens.weight", "lm_head.weight",
                            "model.layers.3.mlp.down_proj.weight",
                            "visual.patch_embed.proj.weight", "visual.merger.mlp.0.weight"};
    for (size_t i = 0; i < sizeof normal / sizeof normal[0]; i++) {
        double mean, sd;
        float lo, hi;
        tensor_stats(st, normal[i], &mean, &sd, &lo, &hi);
        cr_expect_lt(fabs(mean), 0.002, "%s mean %g", normal[i], mean);
        cr_expect(sd > 0.016 && sd < 0.024, "%s std %g is within 20%% of 0.02", normal[i], sd);
        cr_expect(hi > 0.06 && lo < -0.06 && hi < 0.2 && lo > -0.2,
                  "%s range [%g, %g] looks Gaussian", normal[i], lo, hi);
    }
    for (size_t i = 0; i < vlmd_safetensors_count(st); i++) {
        const char *name = vlmd_safetensors_at(st, i)->name;
        bool is_bias = strstr(name, ".bias") != NULL;
        bool is_norm = strstr(name, "norm") != NULL || strstr(name, "ln_q") != NULL;
        if (!is_bias && !is_norm)
            continue;
        double mean, sd;
        float lo, hi;
        tensor_stats(st, name, &mean, &sd, &lo, &hi);
        float want = is_bias ? 0.0f : 1.0f;
        cr_expect(lo == want && hi == want, "%s is all %g, found [%g, %g]", name, want, lo, hi);
    }
    /* Untied and independent: no tensor repeats another's values. */
    const vlmd_tensor_view *emb = vlmd_safetensors_find(st, "model.embed_tokens.weight");
    const vlmd_tensor_view *head = vlmd_safetensors_find(st, "lm_head.weight");
    const vlmd_tensor_view *q0 = vlmd_safetensors_find(st, "model.layers.0.self_attn.q_proj.weight");
    const vlmd_tensor_view *q1 = vlmd_safetensors_find(st, "model.layers.1.self_attn.q_proj.weight");
    cr_expect_neq(memcmp(emb->data, head->data, emb->nbytes), 0);
    cr_expect_neq(memcmp(q0->data, q1->data, q0->nbytes), 0);
    vlmd_safetensors_close(st);
    remove_dir(dir);
}

/* ---- tokenizer ----------------------------------------------------------- */

Test(demo_model, tokenizer_is_qwen_layout_byte_level_bpe)
{
    char *dir = make_model(0);
    json_t *tok = load_json(path_in(dir, "tokenizer.json"));
    json_t *ref = load_json(test_fixture("qwen2_vl/tokenizer.json"));
    json_t *model = json_object_get(tok, "model");
    cr_expect_str_eq(json_string_value(json_object_get(model, "type")), "BPE");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(tok, "normalizer"),
                                                       "type")), "NFC");
    cr_expect(json_equal(json_object_get(tok, "pre_tokenizer"),
                         json_object_get(ref, "pre_tokenizer")),
              "the fixture's pre-tokenizer: Qwen2 Split regex, then ByteLevel");
    cr_expect(json_equal(json_object_get(tok, "decoder"), json_object_get(ref, "decoder")));

    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *ref_vocab = json_object_get(json_object_get(ref, "model"), "vocab");
    size_t n_vocab = json_object_size(vocab), n_merges = json_array_size(merges);
    cr_expect(n_merges >= 500 && n_merges <= 800, "%zu merges", n_merges);
    cr_expect_eq(n_vocab, 256 + n_merges, "each merge adds one token");

    /* id -> token, checking ids are dense */
    const char **by_id = calloc(n_vocab, sizeof *by_id);
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        json_int_t id = json_integer_value(val);
        cr_assert(id >= 0 && (size_t)id < n_vocab, "'%s' has id %lld", key, (long long)id);
        cr_assert_null(by_id[id], "id %lld used twice", (long long)id);
        by_id[id] = key;
    }
    json_object_foreach(ref_vocab, key, val)
        if (json_integer_value(val) < 256)
            cr_expect_str_eq(by_id[json_integer_value(val)], key, "byte symbol %lld",
                             (long long)json_integer_value(val));
    cr_expect_str_eq(by_id[220], "\xc4\xa0", "space is U+0120 at 220 as in Qwen");

    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m)
    {
        const char *a = json_string_value(json_array_get(m, 0));
        const char *b = json_string_value(json_array_get(m, 1));
        cr_assert(json_array_size(m) == 2 && a && b, "merge %zu is a pair of strings", i);
        cr_expect_not_null(json_object_get(vocab, a), "merge %zu: '%s' in vocab", i, a);
        cr_expect_not_null(json_object_get(vocab, b), "merge %zu: '%s' in vocab", i, b);
        char *ab = vlmd_asprintf("%s%s", a, b);
        cr_expect_str_eq(by_id[256 + i], ab, "merge %zu makes token %zu", i, 256 + i);
        /* its pieces exist before it does */
        cr_expect_lt(json_integer_value(json_object_get(vocab, a)), (json_int_t)(256 + i));
        cr_expect_lt(json_integer_value(json_object_get(vocab, b)), (json_int_t)(256 + i));
        free(ab);
    }

    /* Qwen's added tokens (the Qwen3.5 fixture's) in its order, right after the vocab,
     * special as there (<tool_call>, <think> and the rest are not) */
    json_t *added = json_object_get(tok, "added_tokens");
    json_t *qwen = load_json(test_fixture("qwen3_5/tokenizer.json"));
    json_t *ref_added = json_object_get(qwen, "added_tokens");
    cr_assert_eq(json_array_size(added), json_array_size(ref_added));
    json_array_foreach(added, i, m)
    {
        json_t *r = json_array_get(ref_added, i);
        cr_expect_str_eq(json_string_value(json_object_get(m, "content")),
                         json_string_value(json_object_get(r, "content")));
        cr_expect_eq(int_at(m, "id"), (json_int_t)(n_vocab + i));
        cr_expect_eq(json_is_true(json_object_get(m, "special")),
                     json_is_true(json_object_get(r, "special")), "%zu", i);
    }
    json_decref(qwen);
    /* config.json's ids name the right specials. */
    json_t *cfg = load_json(path_in(dir, "config.json"));
    json_t *text = json_object_get(cfg, "text_config");
    const struct {
        json_t *obj;
        const char *key, *content;
    } named[] = {
        {text, "bos_token_id", "<|endoftext|>"},
        {text, "eos_token_id", "<|im_end|>"},
        {cfg, "image_token_id", "<|image_pad|>"},
        {cfg, "video_token_id", "<|video_pad|>"},
        {cfg, "vision_start_token_id", "<|vision_start|>"},
        {cfg, "vision_end_token_id", "<|vision_end|>"},
    };
    for (size_t k = 0; k < sizeof named / sizeof named[0]; k++) {
        json_int_t id = int_at(named[k].obj, named[k].key);
        json_t *a = json_array_get(added, (size_t)(id - (json_int_t)n_vocab));
        cr_assert_not_null(a, "%s %lld", named[k].key, (long long)id);
        cr_expect_str_eq(json_string_value(json_object_get(a, "content")), named[k].content,
                         "%s", named[k].key);
    }
    json_t *tc = load_json(path_in(dir, "tokenizer_config.json"));
    cr_expect_str_eq(json_string_value(json_object_get(tc, "eos_token")), "<|im_end|>");
    char *tdir = vlmd_asprintf("%s", dir);
    const char *source = NULL;
    cr_expect_str_eq(vlmd_chat_family_for_model(tdir, VLMD_ARCH_QWEN2_VL, &source)->name, "qwen3_5",
                     "the demo's template is Qwen3.5's: tools and the thinking switch");
    free(tdir);
    json_t *dec = json_object_get(tc, "added_tokens_decoder");
    cr_expect_eq(json_object_size(dec), json_array_size(added));
    json_decref(tc);
    json_decref(cfg);
    free(by_id);
    json_decref(ref);
    json_decref(tok);
    remove_dir(dir);
}

Test(demo_model, vlmd_tokenizer_round_trips_text_through_it)
{
    char *dir = make_model(0);
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_tokenizer_load(path_in(dir, "tokenizer.json"), &tok, &err), VLMD_OK, "%s",
                 err.msg);
    vlmd_model_config mc;
    load_config(dir, &mc);
    cr_expect_leq(vlmd_tokenizer_size(tok), mc.text.vocab_size);
    const char *texts[] = {
        "The assistant answers the question about the picture in a few words.",
        "Caf\xc3\xa9 au lait, \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e and \xf0\x9f\x99\x82!",
        "int main(void)\n{\n    return 0;\n}\n",
        "  two  spaces,\ttabs\r\nand 12345 digits ...",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        vlmd_tokens ids = {0};
        vlmd_buf back = VLMD_BUF_INIT;
        cr_assert_eq(vlmd_tokenizer_encode(tok, texts[i], strlen(texts[i]), VLMD_SPECIAL_SPLIT,
                                           &ids), VLMD_OK);
        cr_assert_eq(vlmd_tokenizer_decode(tok, ids.ids, ids.n, false, &back, &err), VLMD_OK,
                     "%s", err.msg);
        cr_expect_str_eq(back.data ? back.data : "", texts[i]);
        if (i == 0)
            cr_expect_lt(ids.n * 2, strlen(texts[i]), "English: %zu tokens for %zu bytes", ids.n,
                         strlen(texts[i]));
        vlmd_tokens_free(&ids);
        vlmd_buf_free(&back);
    }
    const char chat[] = "<|im_start|>user\nHello!<|im_end|>";
    vlmd_tokens ids = {0};
    cr_assert_eq(vlmd_tokenizer_encode(tok, chat, strlen(chat), VLMD_SPECIAL_MATCH, &ids), VLMD_OK);
    cr_assert_gt(ids.n, 2);
    cr_expect_eq(ids.ids[0], (uint32_t)vlmd_tokenizer_find(tok, "<|im_start|>"));
    cr_expect_eq(ids.ids[ids.n - 1], (uint32_t)mc.text.eos_token_id);
    cr_expect(vlmd_tokenizer_is_special(tok, (uint32_t)mc.image_token_id));
    vlmd_tokens_free(&ids);
    vlmd_tokenizer_free(tok);
    remove_dir(dir);
}

/* ---- the forward --------------------------------------------------------- */

Test(demo_model, vlmd_forward_runs_on_the_text_weights)
{
    char *dir = make_model(0);
    vlmd_model_config mc;
    load_config(dir, &mc);
    vlmd_error err = {0};
    vlmd_backend *b = NULL;
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors *st = open_weights(path_in(dir, "model.safetensors"));
    lm_model *m = NULL;
    cr_assert_eq(lm_load(b, &mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    cr_assert_eq(lm_vocab_size(m), (uint32_t)mc.text.vocab_size);

    enum { N = 6 };
    const int V = (int)lm_vocab_size(m);
    lm_kv *kv = NULL;
    lm_workspace *ws = NULL;
    cr_assert_eq(lm_kv_create(m, N, &kv, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_workspace_create(m, N, N, N, &ws, &err), VLMD_OK, "%s", err.msg);
    int32_t ids[N] = {(int32_t)mc.text.bos_token_id, 260, 300, 12, 500, 700};
    int32_t pos[3 * N], slots[N], rows[N];
    for (int i = 0; i < N; i++) {
        slots[i] = rows[i] = i;
        for (int r = 0; r < 3; r++)
            pos[r * N + i] = i;
    }
    float *logits = malloc((size_t)N * (size_t)V * sizeof *logits);
    vlmd_attn_seq seq = {0, N, N, slots};
    lm_batch batch = {N, ids, pos, slots, &seq, 1, rows, N};
    cr_assert_eq(lm_forward(m, kv, ws, &batch, logits, &err), VLMD_OK, "%s", err.msg);
    for (int r = 0; r < N; r++) {
        double sum = 0, sq = 0;
        bool finite = true;
        for (int k = 0; k < V; k++) {
            float x = logits[(size_t)r * V + k];
            finite = finite && isfinite(x);
            sum += x;
            sq += (double)x * x;
        }
        double sd = sqrt(sq / V - (sum / V) * (sum / V));
        cr_expect(finite, "row %d logits are finite", r);
        cr_expect(sd > 1e-3 && sd < 10.0, "row %d logits spread %g", r, sd);
    }
    cr_expect_neq(memcmp(logits, logits + (size_t)(N - 1) * V, (size_t)V * sizeof *logits), 0,
                  "different contexts, different logits");
    free(logits);
    lm_workspace_free(m, ws);
    lm_kv_free(m, kv);
    lm_free(m);
    vlmd_backend_destroy(b);
    remove_dir(dir);
}

/* ---- reproducibility and the directory ----------------------------------- */

Test(demo_model, same_seed_same_bytes_other_seed_other_weights_only)
{
    char *a = make_model(3), *b = make_model(3), *c = make_model(4);
    for (size_t i = 0; i + 1 < N_MODEL_FILES; i++) { /* all but the stamp */
        const char *f = model_files[i];
        char pa[4096], pb[4096], pc[4096];
        snprintf(pa, sizeof pa, "%s", path_in(a, f));
        snprintf(pb, sizeof pb, "%s", path_in(b, f));
        snprintf(pc, sizeof pc, "%s", path_in(c, f));
        cr_expect(same_file(pa, pb), "%s is reproducible", f);
        if (strcmp(f, "model.safetensors") == 0)
            cr_expect_not(same_file(pa, pc), "another seed gives other weights");
        else
            cr_expect(same_file(pa, pc), "%s does not depend on the seed", f);
    }
    remove_dir(a);
    remove_dir(b);
    remove_dir(c);
}

Test(demo_model, second_run_is_a_no_op)
{
    char *dir = make_model(0);
    struct stat before[N_MODEL_FILES], after;
    for (size_t i = 0; i < N_MODEL_FILES; i++)
        cr_assert_eq(stat(path_in(dir, model_files[i]), &before[i]), 0, "%s", model_files[i]);
    bool unchanged = false;
    cr_assert_eq(vlmd_demo_model_write(dir, 0, &unchanged, NULL), VLMD_OK);
    cr_expect(unchanged);
    for (size_t i = 0; i < N_MODEL_FILES; i++) {
        cr_assert_eq(stat(path_in(dir, model_files[i]), &after), 0);
        cr_expect(after.st_ino == before[i].st_ino &&
                      after.st_mtim.tv_sec == before[i].st_mtim.tv_sec &&
                      after.st_mtim.tv_nsec == before[i].st_mtim.tv_nsec,
                  "%s not rewritten", model_files[i]);
    }
    remove_dir(dir);
}

Test(demo_model, an_incomplete_or_other_seed_demo_model_is_rewritten)
{
    char *dir = make_model(0), *ref = make_model(1);
    unlink(path_in(dir, "model.safetensors"));
    bool unchanged = true;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_demo_model_write(dir, 0, &unchanged, &err), VLMD_OK, "%s", err.msg);
    cr_expect_not(unchanged, "a missing file is written again");
    cr_expect_eq(access(path_in(dir, "model.safetensors"), F_OK), 0);

    /* Our own model with another seed is ours to replace. */
    cr_assert_eq(vlmd_demo_model_write(dir, 1, &unchanged, &err), VLMD_OK, "%s", err.msg);
    cr_expect_not(unchanged);
    char mine[4096];
    snprintf(mine, sizeof mine, "%s", path_in(dir, "model.safetensors"));
    cr_expect(same_file(mine, path_in(ref, "model.safetensors")), "now the seed-1 weights");
    remove_dir(ref);
    remove_dir(dir);
}

Test(demo_model, a_foreign_model_is_not_overwritten)
{
    const char *names[] = {"config.json", "tokenizer.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *dir = fresh_dir();
        FILE *f = fopen(path_in(dir, names[i]), "w");
        cr_assert_not_null(f);
        fputs("{\"architectures\": [\"SomethingElse\"]}", f);
        fclose(f);
        bool unchanged = true;
        vlmd_error err = {0};
        cr_expect_eq(vlmd_demo_model_write(dir, 0, &unchanged, &err), VLMD_ERR_INVALID_ARG,
                     "a dir with only %s", names[i]);
        cr_expect_not(unchanged);
        cr_expect(strstr(err.msg, "refusing") && strstr(err.msg, names[i]), "%s", err.msg);
        vlmd_buf text = VLMD_BUF_INIT;
        read_all(path_in(dir, names[i]), &text);
        cr_expect(strstr(text.data, "SomethingElse"), "%s untouched", names[i]);
        vlmd_buf_free(&text);
        for (size_t k = 0; k < N_MODEL_FILES; k++)
            if (strcmp(model_files[k], names[i]) != 0)
                cr_expect_neq(access(path_in(dir, model_files[k]), F_OK), 0,
                              "%s not written next to a foreign %s", model_files[k], names[i]);
        remove_dir(dir);
    }
}

/* ---- the command --------------------------------------------------------- */

/* Runs vlmd-make-demo-model with args; returns its exit code. */
static int run_tool(const char *args)
{
    const char *bin_dir = getenv("VLMD_BIN_DIR");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/vlmd-make-demo-model' %s >/dev/null 2>&1",
             bin_dir && *bin_dir ? bin_dir : VLMD_BIN_DIR, args);
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc), "%s", cmd);
    return WEXITSTATUS(rc);
}

Test(demo_model, the_command_exit_codes)
{
    char *dir = fresh_dir();
    char nested[4096], args[8192];
    snprintf(nested, sizeof nested, "%s/a/b", dir);
    snprintf(args, sizeof args, "'%s' --seed 5", nested);
    cr_expect_eq(run_tool(args), 0, "writes, creating the parents");
    cr_expect_eq(access(path_in(nested, "model.safetensors"), F_OK), 0);
    cr_expect_eq(run_tool(args), 0, "already there");

    char *foreign = fresh_dir();
    FILE *f = fopen(path_in(foreign, "config.json"), "w");
    cr_assert_not_null(f);
    fputs("{}", f);
    fclose(f);
    snprintf(args, sizeof args, "'%s'", foreign);
    cr_expect_eq(run_tool(args), 1, "a foreign model is refused");
    cr_expect_eq(run_tool(""), 2, "no DIR");
    snprintf(args, sizeof args, "'%s' --seed nope", nested);
    cr_expect_eq(run_tool(args), 2, "a bad seed");
    cr_expect_eq(run_tool("a b"), 2, "two DIRs");

    for (size_t i = 0; i < N_MODEL_FILES; i++)
        unlink(path_in(nested, model_files[i]));
    rmdir(nested);
    snprintf(nested, sizeof nested, "%s/a", dir);
    rmdir(nested);
    remove_dir(dir);
    remove_dir(foreign);
}
