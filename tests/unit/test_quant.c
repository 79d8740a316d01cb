/* test_quant.c - quantized checkpoints as published: every format's loader
 * (llm_worker/lm_quant.c) against the fixtures' dequantized spot values, bit
 * for bit; the refusals of what vlmd does not serve, named, before anything
 * loads; quantization_config's parsing. The logits and greedy continuations
 * of every quant fixture are test_lm's (quant_*), tensor parallelism
 * test_tp's, the kernels test_cpu_kernels' and test_cuda_ops'. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "fp8.h"
#include "lm_impl.h"
#include "lm_weights.h"
#include "profile.h"
#include "test_support.h"

static const char *const quant_fixtures[] = {
    "quant/qwen3_fp8_block", "quant/qwen3_moe_fp8_block_bf16scale", "quant/qwen3_fp8_channel_ct",
    "quant/qwen3_fp8_kv",    "quant/qwen3_awq",   "quant/qwen3_gptq_v2",
    "quant/qwen3_moe_gptq",  "quant/qwen3_w4a16_ct",
};
#define N_QUANT (sizeof quant_fixtures / sizeof *quant_fixtures)

/* A model shell the loader can fill: a backend, the checkpoint's quantization. */
typedef struct shell {
    vlmd_backend *b;
    lm_model m;
    vlmd_model_config mc;
    vlmd_safetensors *st;
} shell;

static void shell_open(shell *s, const char *dir, const char *weights)
{
    memset(s, 0, sizeof *s);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(dir, &s->mc, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_create("cpu", &s->b, &err), VLMD_OK, "%s", err.msg);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, weights);
    cr_assert_eq(vlmd_safetensors_open_file(path, &s->st, &err), VLMD_OK, "%s", err.msg);
    s->m.b = s->b;
    s->m.op = vlmd_backend_ops(s->b);
    s->m.quant = s->mc.quant;
    s->m.world = 1;
}

static void shell_close(shell *s)
{
    vlmd_backend_free_owned(s->b, &s->m.weights);
    vlmd_safetensors_close(s->st);
    vlmd_backend_destroy(s->b);
}

/* Loads linear `name` ("<...>.weight", out x in) of the shell's checkpoint. */
static vlmd_status load_linear(shell *s, const char *name, int64_t out, int64_t in,
                               vlmd_qweight *w, vlmd_error *err)
{
    lm_loader ld;
    loader_init(&ld, &s->m, s->st, NULL);
    loader_at(&ld, "%s", "");
    loader_whole(&ld, name, out, in);
    vlmd_status st = loader_load_matrix(&ld, w, err);
    loader_free(&ld);
    return st;
}

/* Every fixture's dequant.<linear>.rows / .values: the rows as the loader
 * holds them, dequantized by the C kernel table and by the best one this CPU
 * has, are the reference's floats bit for bit (a partial last row block and
 * a partial last column block among them). */
Test(quant, every_format_dequantizes_the_fixtures_spot_values_bit_for_bit)
{
    int checked = 0;
    for (size_t f = 0; f < N_QUANT; f++) {
        shell s;
        shell_open(&s, test_fixture(quant_fixtures[f]), "model.safetensors");
        vlmd_safetensors *ref = test_reference_tensors(quant_fixtures[f]);
        for (size_t i = 0; i < vlmd_safetensors_count(ref); i++) {
            const vlmd_tensor_view *rows = vlmd_safetensors_at(ref, i);
            size_t len = strlen(rows->name);
            if (strncmp(rows->name, "dequant.", 8) != 0 || strcmp(rows->name + len - 5, ".rows"))
                continue;
            char linear[256], values_name[300];
            snprintf(linear, sizeof linear, "%.*s", (int)(len - 8 - 5), rows->name + 8);
            snprintf(values_name, sizeof values_name, "dequant.%s.values", linear);
            const vlmd_tensor_view *values = vlmd_safetensors_find(ref, values_name);
            cr_assert_not_null(values, "%s", values_name);
            const int64_t *r = rows->data, in = values->shape[1], out = r[7] + 1;
            vlmd_qweight w;
            vlmd_error err = {0};
            cr_assert_eq(load_linear(&s, linear, out, in, &w, &err), VLMD_OK, "%s", err.msg);
            cr_expect_neq(w.format, VLMD_QFORMAT_NONE, "%s is quantized", linear);
            float *got = malloc((size_t)in * sizeof *got), *best = malloc((size_t)in * sizeof *best);
            for (int k = 0; k < 8; k++) {
                const float *want = (const float *)values->data + k * in;
                vlmd_cpu_kernels_c.dequant(got, &w, (int)r[k], (int)in);
                vlmd_cpu_kernels_best()->dequant(best, &w, (int)r[k], (int)in);
                cr_expect(memcmp(got, want, (size_t)in * sizeof *got) == 0,
                          "%s %s row %lld: dequantized = the reference's", quant_fixtures[f],
                          linear, (long long)r[k]);
                cr_expect(memcmp(best, got, (size_t)in * sizeof *got) == 0,
                          "%s %s row %lld: the %s table = the C one", quant_fixtures[f], linear,
                          (long long)r[k], vlmd_cpu_kernels_best()->name);
            }
            free(got), free(best);
            checked++;
        }
        vlmd_safetensors_close(ref);
        shell_close(&s);
    }
    cr_expect_eq(checked, 3 * (int)N_QUANT, "three linears a fixture");
}

/* A quantized model is held in the bytes its format takes: FP8 one byte a
 * weight and its scales; 4-bit half a byte, and fp32 scales (and zero
 * points where the checkpoint has them) a group. */
Test(quant, the_weights_take_the_quantized_bytes)
{
    shell s;
    shell_open(&s, test_fixture("quant/qwen3_fp8_block"), "model.safetensors");
    vlmd_qweight w;
    vlmd_error err = {0};
    /* mlp.down_proj [256, 320]: 128x128 blocks, rows on whole blocks (2 scale rows, 3 groups) */
    cr_assert_eq(load_linear(&s, "model.layers.0.mlp.down_proj.weight", 256, 320, &w, &err),
                 VLMD_OK, "%s", err.msg);
    cr_expect_eq(w.format, VLMD_QFORMAT_FP8);
    cr_expect_eq(w.group, 128);
    cr_expect_eq(w.row_block, 128, "the published blocks kept");
    cr_expect_eq(vlmd_backend_allocated_bytes(s.b), 256 * 320 + 2 * 3 * 4);
    shell_close(&s);

    shell_open(&s, test_fixture("quant/qwen3_awq"), "model.safetensors");
    cr_assert_eq(load_linear(&s, "model.layers.0.mlp.down_proj.weight", 256, 384, &w, &err),
                 VLMD_OK, "%s", err.msg);
    cr_expect_eq(w.format, VLMD_QFORMAT_INT4);
    cr_expect_not_null(w.zeros, "AWQ has zero points");
    cr_expect_eq(vlmd_backend_allocated_bytes(s.b), 256 * 384 / 2 + 256 * 3 * (4 + 1));
    shell_close(&s);

    shell_open(&s, test_fixture("quant/qwen3_gptq_v2"), "model.safetensors");
    cr_assert_eq(load_linear(&s, "model.layers.0.mlp.down_proj.weight", 256, 384, &w, &err),
                 VLMD_OK, "%s", err.msg);
    cr_expect_null(w.zeros, "symmetric GPTQ (every zero point 8) keeps none");
    cr_expect_eq(vlmd_backend_allocated_bytes(s.b), 256 * 384 / 2 + 256 * 3 * 4);
    shell_close(&s);
}

/* A tensor-parallel share whose columns start inside a scale group cannot
 * be held (its first columns would need the group's scale from another
 * rank's view): refused naming the tensor, the column and the group. */
Test(quant, a_column_share_inside_a_group_is_refused)
{
    shell s;
    shell_open(&s, test_fixture("quant/qwen3_awq"), "model.safetensors");
    lm_loader ld;
    loader_init(&ld, &s.m, s.st, NULL);
    loader_at(&ld, "%s", "model.layers.0.mlp.");
    loader_part(&ld, "down_proj.weight", 256, 384, 0, 256, 192, 192);
    vlmd_qweight w;
    vlmd_error err = {0};
    cr_expect_eq(loader_load_matrix(&ld, &w, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "model.layers.0.mlp.down_proj.weight") &&
                  strstr(err.msg, "column 192 cuts a group of 128 columns"), "%s", err.msg);
    /* on a group boundary it loads, and is the whole tensor's columns */
    loader_part(&ld, "down_proj.weight", 256, 384, 0, 256, 128, 256);
    cr_assert_eq(loader_load_matrix(&ld, &w, &err), VLMD_OK, "%s", err.msg);
    vlmd_qweight whole;
    loader_whole(&ld, "down_proj.weight", 256, 384);
    cr_assert_eq(loader_load_matrix(&ld, &whole, &err), VLMD_OK, "%s", err.msg);
    float a[384], b[384];
    for (int r = 0; r < 256; r += 51) {
        vlmd_cpu_kernels_c.dequant(a, &w, r, 256);
        vlmd_cpu_kernels_c.dequant(b, &whole, r, 384);
        cr_expect(memcmp(a, b + 128, 256 * sizeof *a) == 0, "row %d's columns 128..383", r);
    }
    loader_free(&ld);
    shell_close(&s);
}

/* ---- refusals ------------------------------------------------------------- */

/* A copy of fixture dir in a temporary directory with config.json's
 * quantization_config replaced by `qc` (JSON; NULL: as it is) and the
 * checkpoint's tensors filtered: skip names one left out, rename turns
 * "from=to" (NULL: none). Returns the directory (free it with rm_dir). */
static char *variant(const char *fixture, const char *qc, const char *skip, const char *rename)
{
    char *dir = strdup("/tmp/vlmd-quant-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    json_error_t je;
    char path[4096];
    char src[4096];
    snprintf(src, sizeof src, "%s", test_fixture(fixture)); /* (a static buffer) */
    snprintf(path, sizeof path, "%.4000s/config.json", src);
    json_t *config = json_load_file(path, 0, &je);
    cr_assert_not_null(config);
    if (qc)
        json_object_set_new(config, "quantization_config", json_loads(qc, 0, &je));
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(config, path, JSON_INDENT(1)), 0);
    json_decref(config);
    /* the checkpoint: its header rewritten, its data copied as it is */
    snprintf(path, sizeof path, "%.4000s/model.safetensors", src);
    FILE *in = fopen(path, "rb");
    cr_assert_not_null(in);
    uint64_t n;
    cr_assert_eq(fread(&n, 8, 1, in), 1);
    char *header = malloc(n + 1);
    cr_assert_eq(fread(header, 1, n, in), n);
    header[n] = 0;
    json_t *h = json_loads(header, 0, &je);
    cr_assert_not_null(h);
    if (skip)
        cr_assert_eq(json_object_del(h, skip), 0, "%s is in the checkpoint", skip);
    if (rename) {
        char from[256], *eq;
        snprintf(from, sizeof from, "%s", rename);
        eq = strchr(from, '=');
        *eq = 0;
        json_t *t = json_object_get(h, from);
        cr_assert_not_null(t, "%s", from);
        json_object_set(h, eq + 1, t);
        json_object_del(h, from);
    }
    char *text = json_dumps(h, JSON_COMPACT);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *out = fopen(path, "wb");
    uint64_t pn = padded;
    fwrite(&pn, 8, 1, out);
    fwrite(text, 1, len, out);
    for (size_t i = len; i < padded; i++)
        fputc(' ', out);
    char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, got, out);
    fclose(out);
    fclose(in);
    free(text), free(header);
    json_decref(h);
    return dir;
}

static void rm_dir(char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Loads the model in dir on the CPU; returns the status, err the message. */
static vlmd_status try_load(const char *dir, vlmd_error *err)
{
    vlmd_model_config mc;
    vlmd_status s = vlmd_model_config_load(dir, &mc, err);
    if (s != VLMD_OK)
        return s;
    vlmd_backend *b = NULL;
    cr_assert_eq(vlmd_backend_create("cpu", &b, NULL), VLMD_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(path, &st, NULL), VLMD_OK);
    lm_model *m = NULL;
    uint64_t bytes = 0;
    vlmd_error sizing = {0};
    vlmd_status sized = lm_weight_bytes(b, &mc, st, &bytes, &sizing);
    s = lm_load(b, &mc, st, &m, err);
    cr_expect_eq(sized, s, "sizing and loading agree: %s / %s", sizing.msg, err->msg);
    if (s != VLMD_OK) {
        cr_expect_null(m, "nothing half-loaded");
        cr_expect_eq(vlmd_backend_allocated_bytes(b), 0, "every byte given back");
    }
    lm_free(m);
    vlmd_safetensors_close(st);
    vlmd_backend_destroy(b);
    return s;
}

static void expect_refused(const char *fixture, const char *qc, const char *skip,
                           const char *rename, const char *const *fragments)
{
    char *dir = variant(fixture, qc, skip, rename);
    vlmd_error err = {0};
    cr_expect_eq(try_load(dir, &err), VLMD_ERR_MODEL, "%s refused", fixture);
    for (const char *const *f = fragments; *f; f++)
        cr_expect(strstr(err.msg, *f), "'%s' in: %s", *f, err.msg);
    rm_dir(dir);
}

Test(quant, an_unknown_method_is_refused_naming_it_and_what_is_served)
{
    expect_refused("quant/qwen3_awq", "{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}",
                   NULL, NULL,
                   (const char *[]){"quant_method 'bitsandbytes'", "vlmd serves fp8", "awq",
                                    "gptq", NULL});
    expect_refused("quant/qwen3_awq", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": "
                   "128, \"version\": \"gemv\", \"zero_point\": true}", NULL, NULL,
                   (const char *[]){"awq version 'gemv'", NULL});
    expect_refused("quant/qwen3_gptq_v2", "{\"quant_method\": \"gptq\", \"bits\": 3, "
                   "\"group_size\": 128}", NULL, NULL,
                   (const char *[]){"gptq with 3-bit weights", NULL});
    expect_refused("quant/qwen3_w4a16_ct",
                   "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
                   "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                   "{\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"group\", \"group_size\": "
                   "128, \"symmetric\": false}}}}", NULL, NULL,
                   (const char *[]){"asymmetric", NULL});
}

Test(quant, a_missing_scale_is_refused_naming_the_tensor)
{
    expect_refused("quant/qwen3_fp8_block", NULL,
                   "model.layers.1.self_attn.o_proj.weight_scale_inv", NULL,
                   (const char *[]){"missing tensor model.layers.1.self_attn.o_proj."
                                    "weight_scale_inv", NULL});
    expect_refused("quant/qwen3_awq", NULL, "model.layers.2.mlp.up_proj.qzeros", NULL,
                   (const char *[]){"missing tensor model.layers.2.mlp.up_proj.qzeros", NULL});
    /* an F8_E4M3 tensor vlmd reads as a float (a norm): named */
    expect_refused("quant/qwen3_fp8_block", NULL, "model.norm.weight",
                   "model.layers.0.mlp.gate_proj.weight=model.norm.weight",
                   (const char *[]){"model.norm.weight", NULL});
}

/* GPTQ act-order: the fixture's g_idx is i / 128; one with the groups
 * permuted is refused, naming desc_act. (The fixture's bytes are read-only:
 * a permuted g_idx is written into a copy.) */
Test(quant, gptq_act_order_is_refused_naming_desc_act)
{
    char *dir = variant("quant/qwen3_gptq_v2", NULL, NULL, NULL);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    uint64_t n;
    cr_assert_eq(fread(&n, 8, 1, f), 1);
    char *header = malloc(n + 1);
    cr_assert_eq(fread(header, 1, n, f), n);
    header[n] = 0;
    json_error_t je;
    json_t *h = json_loads(header, 0, &je);
    cr_assert_not_null(h);
    json_t *offsets = json_object_get(json_object_get(h, "model.layers.1.mlp.down_proj.g_idx"),
                                      "data_offsets");
    cr_assert_not_null(offsets);
    int32_t swapped[2] = {1, 0}; /* inputs 0 and 1 in groups 1 and 0 */
    fseek(f, 8 + (long)n + (long)json_integer_value(json_array_get(offsets, 0)), SEEK_SET);
    cr_assert_eq(fwrite(swapped, sizeof swapped, 1, f), 1);
    fclose(f);
    json_decref(h);
    free(header);
    vlmd_error err = {0};
    cr_expect_eq(try_load(dir, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "model.layers.1.mlp.down_proj.g_idx") && strstr(err.msg, "desc_act"),
              "%s", err.msg);
    rm_dir(dir);
}

/* ---- quantization_config --------------------------------------------------- */

static vlmd_status parse_qc(const char *qc, vlmd_quant_config *out, vlmd_error *err)
{
    char text[4096];
    snprintf(text, sizeof text, "{\"quantization_config\": %s}", qc);
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    cr_assert_not_null(root, "%s", je.text);
    vlmd_status s = vlmd_quant_config_parse(root, "config.json", out, err);
    json_decref(root);
    return s;
}

Test(quant, every_fixture_config_parses_to_its_format)
{
    static const struct {
        const char *fixture;
        vlmd_quant_method method;
        int group, block;
        bool v2, kv;
    } want[] = {
        {"quant/qwen3_fp8_block", VLMD_QUANT_FP8, 0, 128, false, false},
        {"quant/qwen3_moe_fp8_block_bf16scale", VLMD_QUANT_FP8, 0, 128, false, false},
        {"quant/qwen3_fp8_channel_ct", VLMD_QUANT_CT_FP8, 0, 0, false, false},
        {"quant/qwen3_fp8_kv", VLMD_QUANT_CT_FP8, 0, 0, false, true},
        {"quant/qwen3_awq", VLMD_QUANT_AWQ, 128, 0, false, false},
        {"quant/qwen3_gptq_v2", VLMD_QUANT_GPTQ, 128, 0, true, false},
        {"quant/qwen3_moe_gptq", VLMD_QUANT_GPTQ, 128, 0, false, false},
        {"quant/qwen3_w4a16_ct", VLMD_QUANT_CT_INT4, 128, 0, false, false},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        vlmd_model_config mc;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_model_config_load(test_fixture(want[i].fixture), &mc, &err), VLMD_OK,
                     "%s", err.msg);
        cr_expect_eq(mc.quant.method, want[i].method, "%s", want[i].fixture);
        cr_expect_eq(mc.quant.group_size, want[i].group, "%s", want[i].fixture);
        cr_expect_eq(mc.quant.block[0], want[i].block, "%s", want[i].fixture);
        cr_expect_eq(mc.quant.gptq_v2, want[i].v2, "%s", want[i].fixture);
        cr_expect_eq(mc.quant.kv_fp8, want[i].kv, "%s", want[i].fixture);
    }
    vlmd_model_config plain;
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen3"), &plain, NULL), VLMD_OK);
    cr_expect_eq(plain.quant.method, VLMD_QUANT_NONE);
}

Test(quant, configs_vlmd_cannot_serve_are_refused_by_name)
{
    static const struct {
        const char *qc, *fragment;
    } bad[] = {
        {"{\"quant_method\": \"gguf\"}", "quant_method 'gguf'"},
        {"{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", "fp8 fmt 'e5m2'"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", "weight_block_size"},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": "
         "\"marlin\"}", "checkpoint_format 'marlin'"},
        {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": false}",
         "awq without zero points"},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"a\": {}, \"b\": {}}}",
         "2 config_groups"},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
         "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, \"type\": \"float\", "
         "\"strategy\": \"channel\"}}}, \"kv_cache_scheme\": {\"num_bits\": 8, \"type\": "
         "\"float\", \"strategy\": \"attn_head\"}}", "kv_cache_scheme float 8-bit per attn_head"},
        {"[1, 2]", "is not an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        vlmd_quant_config q;
        vlmd_error err = {0};
        cr_expect_eq(parse_qc(bad[i].qc, &q, &err), VLMD_ERR_MODEL, "%s", bad[i].qc);
        cr_expect(strstr(err.msg, bad[i].fragment) && strstr(err.msg, "vlmd serves"),
                  "'%s' in: %s", bad[i].fragment, err.msg);
        cr_expect_eq(q.method, VLMD_QUANT_NONE);
    }
}

/* e4m3 as c10 defines it: every code decodes and encodes back; ties go to
 * even; past 448 saturates (never NaN, unlike a torch cast); NaN stays. */
Test(quant, e4m3_both_ways)
{
    for (int c = 0; c < 256; c++) {
        float f = vlmd_e4m3_to_f32((uint8_t)c);
        cr_expect_eq(f == f, (c & 0x7f) != 0x7f, "code %02x", c);
        cr_expect(f != f || f == vlmd_e4m3_table[c] || (f == 0 && vlmd_e4m3_table[c] == 0),
                  "code %02x: the kernels' table agrees", c);
        if (f == f && c != 0x80)
            cr_expect_eq(vlmd_f32_to_e4m3(f), c, "code %02x back", c);
    }
    cr_expect_eq(vlmd_e4m3_to_f32(0x7e), 448.0f);
    cr_expect_eq(vlmd_e4m3_to_f32(0x01), 1.0f / 512);
    cr_expect_eq(vlmd_f32_to_e4m3(464.0f), 0x7e);
    cr_expect_eq(vlmd_f32_to_e4m3(1e30f), 0x7e);
    cr_expect_eq(vlmd_f32_to_e4m3(-500.0f), 0xfe);
    cr_expect_eq(vlmd_f32_to_e4m3(1.0625f), 0x38, "1 + 1/16 ties to even 1");
    cr_expect_eq(vlmd_f32_to_e4m3(1.1875f), 0x3a, "1 + 3/16 ties to even 1.25");
    cr_expect_eq(vlmd_f32_to_e4m3(1.5f / 512), 0x02, "a subnormal tie to even");
    float nan = __builtin_nanf("");
    cr_expect_eq(vlmd_f32_to_e4m3(nan) & 0x7f, 0x7f);
}

/* ---- the memory plan ----------------------------------------------------------- */

/* The fp8 fixture as a 16-bit checkpoint: each quantized linear dequantized
 * (the loader's reading, tested above) and rounded to BF16, every other
 * tensor as it is, no quantization_config. Returns its directory. */
static char *bf16_twin(const char *fixture)
{
    shell s;
    shell_open(&s, test_fixture(fixture), "model.safetensors");
    char *dir = strdup("/tmp/vlmd-twin-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    json_t *header = json_object();
    size_t cap = 0, used = 0;
    char *data = NULL;
    for (size_t i = 0; i < vlmd_safetensors_count(s.st); i++) {
        const vlmd_tensor_view *t = vlmd_safetensors_at(s.st, i);
        if (strstr(t->name, "weight_scale_inv"))
            continue;
        size_t bytes = t->nbytes;
        uint16_t *wide = NULL;
        if (t->dtype == VLMD_DTYPE_F8_E4M3) {
            vlmd_qweight w;
            cr_assert_eq(load_linear(&s, t->name, t->shape[0], t->shape[1], &w, NULL), VLMD_OK);
            float *row = malloc((size_t)t->shape[1] * sizeof *row);
            bytes = (size_t)(t->shape[0] * t->shape[1]) * 2;
            wide = malloc(bytes);
            for (int64_t r = 0; r < t->shape[0]; r++) {
                vlmd_cpu_kernels_c.dequant(row, &w, (int)r, (int)t->shape[1]);
                for (int64_t c = 0; c < t->shape[1]; c++)
                    wide[r * t->shape[1] + c] = vlmd_cpu_to_bf16(row[c]);
            }
            free(row);
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(header, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                      wide ? "BF16" : vlmd_dtype_str(t->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)used,
                                      (json_int_t)(used + bytes)));
        if (used + bytes > cap) {
            cap = 2 * (used + bytes);
            data = realloc(data, cap);
        }
        memcpy(data + used, wide ? (const void *)wide : t->data, bytes);
        used += bytes;
        free(wide);
    }
    char path[4096], *text = json_dumps(header, JSON_COMPACT);
    size_t len = strlen(text);
    uint64_t n = (len + 7) / 8 * 8;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    fwrite(&n, 8, 1, f);
    fwrite(text, 1, len, f);
    for (size_t i = len; i < n; i++)
        fputc(' ', f);
    fwrite(data, 1, used, f);
    fclose(f);
    free(text), free(data);
    json_decref(header);
    char src[4200];
    snprintf(src, sizeof src, "%.4000s/config.json", test_fixture(fixture));
    json_t *config = json_load_file(src, 0, NULL);
    json_object_del(config, "quantization_config");
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(config, path, 0), 0);
    json_decref(config);
    shell_close(&s);
    return dir;
}

/* On a (simulated) device with room for the FP8 checkpoint's weights but
 * not for the same model in 16 bits, the FP8 one is admitted and the 16-bit
 * one refused before anything loads, saying that an FP8 checkpoint of it
 * would fit. */
Test(quant, a_model_that_fits_only_quantized_is_admitted_quantized)
{
    const char *fixture = "quant/qwen3_fp8_block";
    char *twin = bf16_twin(fixture);
    uint64_t bytes[2];
    lm_model *shapes[2];
    vlmd_backend *b[2];
    const char *dirs[2] = {test_fixture(fixture), twin};
    char dir0[4096];
    snprintf(dir0, sizeof dir0, "%s", dirs[0]);
    dirs[0] = dir0;
    vlmd_model_config mc[2];
    for (int i = 0; i < 2; i++) {
        char path[4200];
        vlmd_safetensors *st = NULL;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_model_config_load(dirs[i], &mc[i], &err), VLMD_OK, "%s", err.msg);
        snprintf(path, sizeof path, "%s/model.safetensors", dirs[i]);
        cr_assert_eq(vlmd_safetensors_open_file(path, &st, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(vlmd_backend_create("cpu", &b[i], NULL), VLMD_OK);
        cr_assert_eq(lm_load_shapes(b[i], &mc[i], st, NULL, &shapes[i], &bytes[i], &err),
                     VLMD_OK, "%s", err.msg);
        vlmd_safetensors_close(st);
    }
    cr_expect_lt(bytes[0] * 10, bytes[1] * 7, "FP8 %llu bytes, BF16 %llu",
                 (unsigned long long)bytes[0], (unsigned long long)bytes[1]);
    for (int i = 0; i < 2; i++) /* room for the FP8 weights and a third of the difference */
        vlmd_backend_limit(b[i], PROFILE_CANARY_BYTES + bytes[0] + (bytes[1] - bytes[0]) / 3);
    vlmd_error err = {0};
    cr_expect_eq(profile_check_weights(b[0], bytes[0], 0, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(profile_check_weights(b[1], bytes[1], 0, &err), VLMD_ERR_TOO_LARGE);
    profile_suggest_quantized(b[1], shapes[1], bytes[1], &mc[1].quant, &err);
    cr_expect(strstr(err.msg, "nothing was loaded") &&
                  strstr(err.msg, "an FP8 checkpoint of this model (about 1 MiB of weights) "
                                  "would fit"), "%s", err.msg);
    uint64_t fp8, int4;
    lm_quantized_bytes(shapes[1], bytes[1], &fp8, &int4);
    cr_expect(fp8 >= bytes[0] * 9 / 10 && fp8 <= bytes[0] * 11 / 10,
              "the estimate %llu is the FP8 checkpoint's %llu within 10%%",
              (unsigned long long)fp8, (unsigned long long)bytes[0]);
    for (int i = 0; i < 2; i++) {
        lm_free(shapes[i]);
        vlmd_backend_destroy(b[i]);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", twin);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", twin);
    unlink(path);
    rmdir(twin);
    free(twin);
}

/* ---- W8A8 ----------------------------------------------------------------------- */

/* The FP8 fixtures' probe: layer 0's mlp.down_proj alone (a partial last
 * block of columns, 320 = 128 + 128 + 64) on the first 6 tokens' inputs
 * (BF16-exact): weights only it is y, with its inputs quantized per token
 * and group of 128 (or per row) it is y_w8a8, 2.2e-2 away from y. */
Test(quant, w8a8_probe_is_the_references_product)
{
    const char *fixtures[] = {"quant/qwen3_fp8_block", "quant/qwen3_moe_fp8_block_bf16scale",
                              "quant/qwen3_fp8_channel_ct"};
    const char *linear = "model.layers.0.mlp.down_proj.weight";
    for (size_t f = 0; f < 3; f++)
        for (int w8a8 = 0; w8a8 < 2; w8a8++) {
            shell s;
            shell_open(&s, test_fixture(fixtures[f]), "model.safetensors");
            s.m.quant.fp8_activations = w8a8;
            vlmd_safetensors *ref = test_reference_tensors(fixtures[f]);
            char name[256];
            snprintf(name, sizeof name, "probe.%s.x", linear);
            const vlmd_tensor_view *x = vlmd_safetensors_find(ref, name);
            snprintf(name, sizeof name, "probe.%s.y%s", linear, w8a8 ? "_w8a8" : "");
            const vlmd_tensor_view *y = vlmd_safetensors_find(ref, name);
            snprintf(name, sizeof name, "probe.%s.y%s", linear, w8a8 ? "" : "_w8a8");
            const vlmd_tensor_view *other = vlmd_safetensors_find(ref, name);
            cr_assert(x && y && other);
            const int n = (int)x->shape[0], in = (int)x->shape[1], out = (int)y->shape[1];
            vlmd_qweight w;
            vlmd_error err = {0};
            cr_assert_eq(load_linear(&s, linear, out, in, &w, &err), VLMD_OK, "%s", err.msg);
            cr_expect_eq(w.act_group, w8a8 ? (f < 2 ? 128 : -1) : 0);
            float *got = malloc((size_t)n * out * sizeof *got);
            s.m.op->qlinear(s.b, got, x->data, &w, NULL, n, in, out);
            double rel = test_rel_error(got, y->data, (size_t)n * out),
                   apart = test_rel_error(got, other->data, (size_t)n * out);
            cr_expect_lt(rel, 1e-6, "%s %s: relative error %g", fixtures[f],
                         w8a8 ? "W8A8" : "W8A16", rel);
            cr_expect_gt(apart, 1e-2, "%s: %g from the other meaning", fixtures[f], apart);
            free(got);
            vlmd_safetensors_close(ref);
            shell_close(&s);
        }
}
