/* test_safetensors.c - the checkpoint reader: fixtures load in F32 and BF16,
 * sharded directories load, and every kind of broken file is refused with
 * an error that says what is wrong. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"
#include "test_support.h"


Test(safetensors, fixtures_load_in_f32_and_bf16_with_the_same_values)
{
    const char *models[] = {"qwen2", "qwen2_vl", "qwen2_5_vl"};
    for (int m = 0; m < 3; m++) {
        char f32[4200], bf16[4200], dir[4096];
        snprintf(dir, sizeof dir, "%s", test_fixture(models[m]));
        snprintf(f32, sizeof f32, "%s/model.safetensors", dir);
        snprintf(bf16, sizeof bf16, "%s/model.bf16.safetensors", dir);
        vlmd_safetensors *a = NULL, *b = NULL;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_safetensors_open_file(f32, &a, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(vlmd_safetensors_open_file(bf16, &b, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(vlmd_safetensors_count(a), vlmd_safetensors_count(b));
        cr_expect_gt(vlmd_safetensors_count(a), 10);
        for (size_t i = 0; i < vlmd_safetensors_count(a); i++) {
            const vlmd_tensor_view *x = vlmd_safetensors_at(a, i);
            const vlmd_tensor_view *y = vlmd_safetensors_find(b, x->name);
            cr_assert_not_null(y, "%s in the BF16 file", x->name);
            cr_expect_eq(x->dtype, VLMD_DTYPE_F32);
            cr_expect_eq(y->dtype, VLMD_DTYPE_BF16);
            int64_t n = vlmd_tensor_numel(x);
            cr_assert_eq(n, vlmd_tensor_numel(y));
            float *fx = malloc((size_t)n * sizeof *fx), *fy = malloc((size_t)n * sizeof *fy);
            cr_assert_eq(vlmd_tensor_to_f32(x, fx, NULL), VLMD_OK);
            cr_assert_eq(vlmd_tensor_to_f32(y, fy, NULL), VLMD_OK);
            for (int64_t k = 0; k < n; k++)
                if (fabsf(fx[k] - fy[k]) > fabsf(fx[k]) * 0.0079f + 1e-30f) {
                    cr_expect(false, "%s[%lld]: %g vs bf16 %g", x->name, (long long)k, fx[k], fy[k]);
                    break;
                }
            free(fx);
            free(fy);
        }
        vlmd_safetensors_close(a);
        vlmd_safetensors_close(b);
    }
}

Test(safetensors, half_precision_conversions)
{
    cr_expect_float_eq(vlmd_f16_to_f32(0x3c00), 1.0f, 0);
    cr_expect_float_eq(vlmd_f16_to_f32(0xc000), -2.0f, 0);
    cr_expect_float_eq(vlmd_f16_to_f32(0x0001), 5.9604645e-8f, 1e-14);  /* smallest subnormal */
    cr_expect_float_eq(vlmd_f16_to_f32(0x7bff), 65504.0f, 0);
    cr_expect(isinf(vlmd_f16_to_f32(0x7c00)));
    cr_expect_float_eq(vlmd_bf16_to_f32(0x3f80), 1.0f, 0);
    cr_expect_float_eq(vlmd_bf16_to_f32(0xc0a0), -5.0f, 0);
}

/* ---- hand-made files ------------------------------------------------------- */

static char tmpdir[64];

static void setup_dir(void)
{
    strcpy(tmpdir, "/tmp/vlmd-st-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

/* Writes NAME with this header text and data_len bytes of data (0x3f each). */
static const char *write_st(const char *name, const char *header, size_t data_len,
                            long long declared_hlen)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    uint64_t hlen = declared_hlen >= 0 ? (uint64_t)declared_hlen : strlen(header);
    for (int i = 0; i < 8; i++)
        fputc((int)((hlen >> (8 * i)) & 0xff), f);
    fputs(header, f);
    for (size_t i = 0; i < data_len; i++)
        fputc(0x3f, f);
    fclose(f);
    return path;
}

static void expect_refused(const char *path, const char *needle)
{
    vlmd_safetensors *st = (vlmd_safetensors *)1;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_safetensors_open_file(path, &st, &err), VLMD_ERR_MODEL, "%s", needle);
    cr_expect_null(st);
    cr_expect(strstr(err.msg, needle), "'%s' should say '%s'", err.msg, needle);
}

#define GOOD_HEADER                                                                        \
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"                 \
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"                  \
    "\"__metadata__\":{\"format\":\"pt\"}}"

Test(safetensors, a_good_file_and_shape_checks, .init = setup_dir, .fini = teardown_dir)
{
    const char *p = write_st("good.safetensors", GOOD_HEADER, 24, -1);
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_file(p, &st, &err), VLMD_OK, "%s", err.msg);
    const vlmd_tensor_view *t;
    cr_expect_eq(vlmd_safetensors_get(st, "a", 2, (int64_t[]){2, 2}, &t, &err), VLMD_OK);
    cr_expect_eq(vlmd_safetensors_get(st, "a", 2, (int64_t[]){4, 1}, &t, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "tensor a has shape [2, 2], expected [4, 1]"), "%s", err.msg);
    cr_expect_eq(vlmd_safetensors_get(st, "zz", 1, (int64_t[]){3}, &t, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "missing tensor zz (expected shape [3])"), "%s", err.msg);
    vlmd_safetensors_close(st);
}

Test(safetensors, broken_files_are_refused, .init = setup_dir, .fini = teardown_dir)
{
    expect_refused(write_st("trunc.safetensors", GOOD_HEADER, 20, -1), "outside");
    expect_refused(write_st("hdr.safetensors", GOOD_HEADER, 24, 1 << 20), "runs past the end");
    expect_refused(write_st("huge.safetensors", "{}", 0, 200ll << 20), "more than");
    expect_refused(write_st("json.safetensors", "{\"a\":", 0, -1), "not a JSON object");
    expect_refused(write_st("dup.safetensors",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                            4, -1),
                   "not a JSON object");
    expect_refused(write_st("dtype.safetensors",
                            "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                            -1),
                   "unsupported dtype Q4");
    expect_refused(write_st("size.safetensors",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                            -1),
                   "needs 12 bytes, its offsets span 8");
    expect_refused(write_st("neg.safetensors",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
                            4, -1),
                   "bad dimension");
    expect_refused(write_st("rev.safetensors",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                            -1),
                   "outside");
    expect_refused(write_st("overlap.safetensors",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                            12, -1),
                   "overlap");
    char path[256];
    snprintf(path, sizeof path, "%s/short.safetensors", tmpdir);
    FILE *f = fopen(path, "wb");
    fputs("abc", f);
    fclose(f);
    expect_refused(path, "too short");
}

Test(safetensors, sharded_directories, .init = setup_dir, .fini = teardown_dir)
{
    write_st("model-00001-of-00002.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -1);
    write_st("model-00002-of-00002.safetensors",
             "{\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, -1);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmpdir);
    FILE *f = fopen(path, "w");
    fputs("{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
          "\"b\":\"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_dir(tmpdir, &st, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_safetensors_count(st), 2);
    cr_expect_eq(vlmd_safetensors_find(st, "b")->dtype, VLMD_DTYPE_F16);
    vlmd_safetensors_close(st);

    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
          "\"c\":\"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    cr_expect_eq(vlmd_safetensors_open_dir(tmpdir, &st, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "lists tensor c"), "%s", err.msg);

    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"../etc/passwd\"}}", f);
    fclose(f);
    cr_expect_eq(vlmd_safetensors_open_dir(tmpdir, &st, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "bad file name"), "%s", err.msg);
}

/* The same checks on an image in memory (what the fuzz target drives). */
Test(safetensors, an_image_in_memory)
{
    FILE *f = fopen(test_fixture("qwen2/model.safetensors"), "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc(n);
    cr_assert_eq(fread(bytes, 1, n, f), n);
    fclose(f);
    vlmd_safetensors *mem = NULL, *file = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_memory(bytes, n, &mem, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_safetensors_open_file(test_fixture("qwen2/model.safetensors"), &file, &err),
                 VLMD_OK);
    cr_expect_eq(vlmd_safetensors_count(mem), vlmd_safetensors_count(file));
    const vlmd_tensor_view *a = vlmd_safetensors_at(mem, 0), *b = vlmd_safetensors_at(file, 0);
    cr_expect_str_eq(a->name, b->name);
    cr_expect_eq(memcmp(a->data, b->data, a->nbytes), 0);
    vlmd_safetensors_close(mem);
    vlmd_safetensors_close(file);
    cr_expect_eq(vlmd_safetensors_open_memory(bytes, n / 2, &mem, &err), VLMD_ERR_MODEL,
                 "a truncated image");
    cr_expect_null(mem);
    cr_expect_eq(vlmd_safetensors_open_memory(bytes, 7, &mem, &err), VLMD_ERR_MODEL);
    free(bytes);
}

/* Released tensors read the same afterwards: a file's pages come back from
 * the file, and the caller's memory (open_memory) is never dropped. */
Test(safetensors, released_tensors_read_back)
{
    const char *path = test_fixture("qwen2/model.safetensors");
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc(n), *copy = malloc(n);
    cr_assert(bytes && copy);
    cr_assert_eq(fread(bytes, 1, n, f), n);
    fclose(f);
    memcpy(copy, bytes, n);
    vlmd_safetensors *mem = NULL, *file = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_memory(bytes, n, &mem, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_safetensors_open_file(path, &file, &err), VLMD_OK, "%s", err.msg);
    size_t pages = 0;
    for (size_t i = 0; i < vlmd_safetensors_count(file); i++) {
        const vlmd_tensor_view *a = vlmd_safetensors_at(mem, i), *b = vlmd_safetensors_at(file, i);
        pages += b->nbytes / (size_t)sysconf(_SC_PAGESIZE);
        vlmd_safetensors_release(mem, a);
        vlmd_safetensors_release(file, b);
        cr_expect_eq(memcmp(b->data, copy + ((const char *)a->data - bytes), b->nbytes), 0,
                     "%s changed after its release", b->name);
    }
    cr_expect(pages > 2, "the fixture has tensors of whole pages to drop");
    cr_expect_eq(memcmp(bytes, copy, n), 0, "the caller's memory was dropped");
    vlmd_safetensors_close(mem);
    vlmd_safetensors_close(file);
    free(bytes);
    free(copy);
}
