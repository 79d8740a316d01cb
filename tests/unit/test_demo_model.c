/* test_demo_model.c - the generated demo model is a complete, consistent
 * Qwen2-VL checkpoint in Hugging Face layout, reproducible from its seed. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "demo_model.h"
#include "model_config.h"

static char *make_dir(uint64_t seed)
{
    char *dir = strdup("/tmp/vlmd-demo-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    bool unchanged = true;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_demo_model_write(dir, seed, &unchanged, &err), VLMD_OK, "%s", err.msg);
    cr_expect_not(unchanged);
    return dir;
}

static void remove_dir(char *dir)
{
    const char *names[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json", "preprocessor_config.json",
                           "model.safetensors", ".vlmd-demo-model"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    free(dir);
}

static json_t *load_json(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t e;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &e);
    cr_assert_not_null(j, "%s: %s", name, e.text);
    return j;
}

/* Reads model.safetensors: the header (parsed) and the data section. */
static json_t *load_safetensors(const char *dir, vlmd_buf *file, size_t *data_start)
{
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    cr_assert_eq(vlmd_read_file(p, 1u << 30, file, NULL), VLMD_OK);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | (uint8_t)file->data[i];
    cr_assert_eq(hlen % 8, 0, "header padded to 8");
    cr_assert_leq(8 + hlen, file->len);
    json_error_t e;
    json_t *h = json_loadb(file->data + 8, hlen, JSON_REJECT_DUPLICATES, &e);
    cr_assert_not_null(h, "header: %s", e.text);
    *data_start = 8 + hlen;
    return h;
}

static void expect_shape(json_t *header, const char *name, int ndim, const int64_t *dims)
{
    json_t *t = json_object_get(header, name);
    cr_assert_not_null(t, "tensor %s exists", name);
    cr_expect_str_eq(json_string_value(json_object_get(t, "dtype")), "BF16", "%s", name);
    json_t *shape = json_object_get(t, "shape");
    cr_assert_eq((int)json_array_size(shape), ndim, "%s rank", name);
    for (int d = 0; d < ndim; d++)
        cr_expect_eq(json_integer_value(json_array_get(shape, (size_t)d)), dims[d], "%s dim %d",
                     name, d);
}

Test(demo_model, config_loads_and_is_consistent)
{
    char *dir = make_dir(0);
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(dir, &mc, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN2_VL);
    cr_expect_eq(mc.text.head_dim * mc.text.num_heads, mc.text.hidden_size);
    cr_expect_eq(2 * (mc.text.mrope_section[0] + mc.text.mrope_section[1] +
                      mc.text.mrope_section[2]), mc.text.head_dim);
    cr_expect_eq(mc.vision.hidden_size, mc.text.hidden_size, "the merger feeds the LLM");
    cr_expect_lt(mc.image_token_id, mc.text.vocab_size);
    cr_expect_lt(mc.text.eos_token_id, mc.text.vocab_size);
    remove_dir(dir);
}

Test(demo_model, every_qwen2_vl_tensor_with_the_shape_the_config_implies)
{
    char *dir = make_dir(0);
    vlmd_model_config mc;
    cr_assert_eq(vlmd_model_config_load(dir, &mc, NULL), VLMD_OK);
    const vlmd_text_config *t = &mc.text;
    const vlmd_vision_config *v = &mc.vision;
    vlmd_buf file = VLMD_BUF_INIT;
    size_t data_start;
    json_t *h = load_safetensors(dir, &file, &data_start);
    /* The fixture's tensor names, checked against the demo config's dimensions. */
    const int64_t H = t->hidden_size, Q = t->num_heads * t->head_dim,
                  KV = t->num_kv_heads * t->head_dim, I = t->intermediate_size;
    expect_shape(h, "model.embed_tokens.weight", 2, (int64_t[]){t->vocab_size, H});
    expect_shape(h, "lm_head.weight", 2, (int64_t[]){t->vocab_size, H});
    expect_shape(h, "model.norm.weight", 1, (int64_t[]){H});
    char n[128];
    for (int64_t l = 0; l < t->num_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%lld.%s", (long long)l, s), n)
        expect_shape(h, NAME("self_attn.q_proj.weight"), 2, (int64_t[]){Q, H});
        expect_shape(h, NAME("self_attn.q_proj.bias"), 1, (int64_t[]){Q});
        expect_shape(h, NAME("self_attn.k_proj.weight"), 2, (int64_t[]){KV, H});
        expect_shape(h, NAME("self_attn.v_proj.bias"), 1, (int64_t[]){KV});
        expect_shape(h, NAME("self_attn.o_proj.weight"), 2, (int64_t[]){H, Q});
        expect_shape(h, NAME("mlp.gate_proj.weight"), 2, (int64_t[]){I, H});
        expect_shape(h, NAME("mlp.down_proj.weight"), 2, (int64_t[]){H, I});
        expect_shape(h, NAME("input_layernorm.weight"), 1, (int64_t[]){H});
#undef NAME
    }
    const int64_t E = v->embed_dim, M2 = v->spatial_merge_size * v->spatial_merge_size;
    expect_shape(h, "visual.patch_embed.proj.weight", 5,
                 (int64_t[]){E, v->in_channels, v->temporal_patch_size, v->patch_size,
                             v->patch_size});
    for (int64_t b = 0; b < v->depth; b++) {
#define NAME(s) (snprintf(n, sizeof n, "visual.blocks.%lld.%s", (long long)b, s), n)
        expect_shape(h, NAME("attn.qkv.weight"), 2, (int64_t[]){3 * E, E});
        expect_shape(h, NAME("mlp.fc1.weight"), 2, (int64_t[]){v->intermediate_size, E});
        expect_shape(h, NAME("norm2.bias"), 1, (int64_t[]){E});
#undef NAME
    }
    expect_shape(h, "visual.merger.mlp.0.weight", 2, (int64_t[]){E * M2, E * M2});
    expect_shape(h, "visual.merger.mlp.2.weight", 2, (int64_t[]){H, E * M2});

    /* 12 tensors per layer, 12 per block, 6 in the merger, patch embed, 3 text-level. */
    size_t expected = (size_t)(12 * t->num_layers + 12 * v->depth + 6 + 1 + 3);
    cr_expect_eq(json_object_size(h) - 1, expected, "no tensor missing or extra");

    /* Offsets tile the data section exactly, each as large as its shape says. */
    size_t n_tensors = json_object_size(h) - 1, k = 0;
    uint64_t (*spans)[2] = calloc(n_tensors, sizeof *spans);
    const char *key;
    json_t *val;
    json_object_foreach(h, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        json_t *off = json_object_get(val, "data_offsets");
        uint64_t elems = 1;
        json_t *d;
        size_t i;
        json_array_foreach(json_object_get(val, "shape"), i, d) elems *= (uint64_t)json_integer_value(d);
        spans[k][0] = (uint64_t)json_integer_value(json_array_get(off, 0));
        spans[k][1] = (uint64_t)json_integer_value(json_array_get(off, 1));
        cr_expect_eq(spans[k][1] - spans[k][0], elems * 2, "%s size", key);
        k++;
    }
    uint64_t covered = 0;
    for (size_t i = 0; i < n_tensors; i++)
        covered += spans[i][1] - spans[i][0];
    uint64_t max_end = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        max_end = spans[i][1] > max_end ? spans[i][1] : max_end;
        for (size_t j = 0; j < i; j++)
            cr_expect(spans[i][1] <= spans[j][0] || spans[j][1] <= spans[i][0], "no overlap");
    }
    cr_expect_eq(covered, max_end, "no gaps");
    cr_expect_eq(data_start + max_end, file.len, "the file ends with the last tensor");
    free(spans);
    json_decref(h);
    vlmd_buf_free(&file);
    remove_dir(dir);
}

static float bf16_at(const char *p)
{
    uint32_t u = ((uint32_t)(uint8_t)p[0] | (uint32_t)(uint8_t)p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

Test(demo_model, weights_look_like_the_init)
{
    char *dir = make_dir(7);
    vlmd_buf file = VLMD_BUF_INIT;
    size_t data_start;
    json_t *h = load_safetensors(dir, &file, &data_start);
    json_t *off = json_object_get(json_object_get(h, "model.embed_tokens.weight"), "data_offsets");
    uint64_t a = (uint64_t)json_integer_value(json_array_get(off, 0));
    uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 1));
    double sum = 0, sq = 0;
    uint64_t n = (b - a) / 2;
    for (uint64_t i = 0; i < n; i++) {
        double x = bf16_at(file.data + data_start + a + 2 * i);
        sum += x;
        sq += x * x;
    }
    double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    cr_expect_lt(fabs(mean), 0.002, "mean %g", mean);
    cr_expect(sd > 0.016 && sd < 0.024, "std %g is near 0.02", sd);
    off = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    a = (uint64_t)json_integer_value(json_array_get(off, 0));
    cr_expect_float_eq(bf16_at(file.data + data_start + a), 1.0f, 0, "norm weights are 1");
    json_decref(h);
    vlmd_buf_free(&file);
    remove_dir(dir);
}

Test(demo_model, tokenizer_is_a_valid_byte_level_bpe)
{
    char *dir = make_dir(0);
    json_t *tok = load_json(dir, "tokenizer.json");
    json_t *model = json_object_get(tok, "model");
    cr_expect_str_eq(json_string_value(json_object_get(model, "type")), "BPE");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    size_t n_vocab = json_object_size(vocab);
    cr_assert_gt(json_array_size(merges), 300, "enough merges to be useful");
    cr_expect_eq(n_vocab, 256 + json_array_size(merges), "each merge adds one token");
    cr_expect_eq(json_integer_value(json_object_get(vocab, "!")), 0, "bytes_to_unicode order");
    cr_expect_eq(json_integer_value(json_object_get(vocab, "\xc4\xa0")), 220, "space is U+0120");
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m)
    {
        const char *a = json_string_value(json_array_get(m, 0));
        const char *b = json_string_value(json_array_get(m, 1));
        cr_assert(a && b, "merge %zu is a pair of strings", i);
        char *ab = vlmd_asprintf("%s%s", a, b);
        cr_expect_not_null(json_object_get(vocab, a), "merge %zu: '%s' in vocab", i, a);
        cr_expect_eq(json_integer_value(json_object_get(vocab, ab)), (json_int_t)(256 + i),
                     "merge %zu makes token %zu", i, 256 + i);
        free(ab);
    }
    /* Specials follow the vocab, with the ids config.json uses. */
    json_t *added = json_object_get(tok, "added_tokens");
    cr_assert_eq(json_array_size(added), 14);
    json_t *cfg = load_json(dir, "config.json");
    json_array_foreach(added, i, m)
    {
        cr_expect_eq(json_integer_value(json_object_get(m, "id")), (json_int_t)(n_vocab + i));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (strcmp(content, "<|image_pad|>") == 0)
            cr_expect_eq(json_integer_value(json_object_get(cfg, "image_token_id")),
                         (json_int_t)(n_vocab + i));
        if (strcmp(content, "<|vision_start|>") == 0)
            cr_expect_eq(json_integer_value(json_object_get(cfg, "vision_start_token_id")),
                         (json_int_t)(n_vocab + i));
    }
    json_t *pre = json_object_get(tok, "pre_tokenizer");
    cr_expect_str_eq(json_string_value(json_object_get(pre, "type")), "Sequence");
    json_decref(cfg);
    json_decref(tok);
    remove_dir(dir);
}

static void read_all(const char *dir, const char *name, vlmd_buf *out)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(vlmd_read_file(p, 1u << 30, out, NULL), VLMD_OK, "%s", p);
}

Test(demo_model, same_seed_same_bytes_other_seed_other_weights)
{
    char *a = make_dir(3), *b = make_dir(3), *c = make_dir(4);
    const char *names[] = {"model.safetensors", "tokenizer.json", "config.json"};
    for (size_t i = 0; i < 3; i++) {
        vlmd_buf x = VLMD_BUF_INIT, y = VLMD_BUF_INIT, z = VLMD_BUF_INIT;
        read_all(a, names[i], &x);
        read_all(b, names[i], &y);
        read_all(c, names[i], &z);
        cr_expect(x.len == y.len && memcmp(x.data, y.data, x.len) == 0, "%s reproducible",
                  names[i]);
        bool same_c = x.len == z.len && memcmp(x.data, z.data, x.len) == 0;
        if (i == 0)
            cr_expect_not(same_c, "another seed gives other weights");
        else
            cr_expect(same_c, "%s does not depend on the seed", names[i]);
        vlmd_buf_free(&x);
        vlmd_buf_free(&y);
        vlmd_buf_free(&z);
    }
    remove_dir(a);
    remove_dir(b);
    remove_dir(c);
}

Test(demo_model, second_run_is_a_no_op)
{
    char *dir = make_dir(0);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat before, after;
    cr_assert_eq(stat(p, &before), 0);
    bool unchanged = false;
    cr_assert_eq(vlmd_demo_model_write(dir, 0, &unchanged, NULL), VLMD_OK);
    cr_expect(unchanged);
    cr_assert_eq(stat(p, &after), 0);
    cr_expect_eq(before.st_ino, after.st_ino, "not rewritten");
    cr_expect_eq(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    remove_dir(dir);
}

Test(demo_model, a_foreign_model_is_not_overwritten)
{
    char dir[] = "/tmp/vlmd-demo-foreign-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"architectures\": [\"SomethingElse\"]}", f);
    fclose(f);
    bool unchanged = false;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_demo_model_write(dir, 0, &unchanged, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "refusing"), "%s", err.msg);
    vlmd_buf text = VLMD_BUF_INIT;
    cr_assert_eq(vlmd_read_file(p, 4096, &text, NULL), VLMD_OK);
    cr_expect(strstr(text.data, "SomethingElse"), "config.json untouched");
    vlmd_buf_free(&text);
    unlink(p);
    rmdir(dir);
}
