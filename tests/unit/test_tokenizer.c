/* test_tokenizer.c - every tokenizer case of every fixture, exactly; the
 * prompts of the text cases; decode round trips; streaming detokenization. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo_model.h"
#include "test_support.h"
#include "tokenizer.h"

static const char *models[] = {"qwen2", "qwen2_vl", "qwen2_5_vl"};

static vlmd_tokenizer *load(const char *model)
{
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_tokenizer_load(test_model_file(model, "tokenizer.json"), &tok, &err),
                 VLMD_OK, "%s", err.msg);
    return tok;
}

static void expect_ids(const vlmd_tokens *got, json_t *want, const char *what)
{
    bool same = got->n == json_array_size(want);
    for (size_t i = 0; same && i < got->n; i++)
        same = got->ids[i] == (uint32_t)json_integer_value(json_array_get(want, i));
    if (!same) {
        char *w = json_dumps(want, JSON_COMPACT);
        fprintf(stderr, "%s: want %s\n  got", what, w);
        for (size_t i = 0; i < got->n; i++)
            fprintf(stderr, " %u", got->ids[i]);
        fprintf(stderr, "\n");
        free(w);
    }
    cr_expect(same, "%s: ids differ (see stderr)", what);
}

static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int len = p[i] < 0x80 ? 1 : (p[i] >> 5) == 6 ? 2 : (p[i] >> 4) == 14 ? 3
                                   : (p[i] >> 3) == 30 ? 4 : 0;
        if (!len || i + (size_t)len > n)
            return false;
        for (int k = 1; k < len; k++)
            if ((p[i + (size_t)k] & 0xc0) != 0x80)
                return false;
        i += (size_t)len;
    }
    return true;
}

Test(tokenizer, every_fixture_case_encodes_and_decodes_exactly)
{
    for (int m = 0; m < 3; m++) {
        vlmd_tokenizer *tok = load(models[m]);
        json_t *ref = test_reference_json(models[m]);
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(ref, "tokenizer_cases"), i, c)
        {
            const char *text = json_string_value(json_object_get(c, "text"));
            vlmd_tokens ids = {0};
            cr_assert_eq(vlmd_tokenizer_encode(tok, text, strlen(text), true, &ids), VLMD_OK);
            char what[128];
            snprintf(what, sizeof what, "%s case %zu '%.40s'", models[m], i, text);
            expect_ids(&ids, json_object_get(c, "ids"), what);

            vlmd_buf out = VLMD_BUF_INIT;
            cr_assert_eq(vlmd_tokenizer_decode(tok, ids.ids, ids.n, false, &out, NULL), VLMD_OK);
            cr_expect_str_eq(out.data ? out.data : "", json_string_value(json_object_get(c, "decoded")),
                             "%s decodes back", what);

            /* token by token: never a broken character, same text in the end */
            vlmd_detok d = {0};
            vlmd_buf streamed = VLMD_BUF_INIT, chunk = VLMD_BUF_INIT;
            for (size_t k = 0; k < ids.n; k++) {
                vlmd_buf_clear(&chunk);
                cr_assert_eq(vlmd_detok_push(&d, tok, ids.ids[k], &chunk, NULL), VLMD_OK);
                cr_expect(valid_utf8(chunk.data ? chunk.data : "", chunk.len),
                          "%s: chunk %zu is whole UTF-8", what, k);
                vlmd_buf_append(&streamed, chunk.data ? chunk.data : "", chunk.len);
            }
            vlmd_detok_flush(&d, &streamed);
            cr_expect_str_eq(streamed.data ? streamed.data : "", out.data ? out.data : "",
                             "%s: streamed = decoded", what);
            vlmd_buf_free(&streamed);
            vlmd_buf_free(&chunk);
            vlmd_buf_free(&out);
            vlmd_tokens_free(&ids);
        }
        json_decref(ref);
        vlmd_tokenizer_free(tok);
    }
}

Test(tokenizer, text_case_prompts_give_the_reference_input_ids)
{
    for (int m = 0; m < 3; m++) {
        vlmd_tokenizer *tok = load(models[m]);
        json_t *ref = test_reference_json(models[m]);
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(ref, "cases"), i, c)
        {
            if (json_object_get(c, "image_grid_thw"))
                continue; /* image pads are expanded by the chat template's image step */
            const char *prompt = json_string_value(json_object_get(c, "prompt"));
            vlmd_tokens ids = {0};
            cr_assert_eq(vlmd_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids), VLMD_OK);
            char what[64];
            snprintf(what, sizeof what, "%s prompt %zu", models[m], i);
            expect_ids(&ids, json_object_get(c, "input_ids"), what);
            vlmd_tokens_free(&ids);
        }
        json_decref(ref);
        vlmd_tokenizer_free(tok);
    }
}

Test(tokenizer, specials_as_plain_text_when_not_parsed)
{
    vlmd_tokenizer *tok = load("qwen2");
    const char *text = "<|im_start|>";
    vlmd_tokens ids = {0};
    cr_assert_eq(vlmd_tokenizer_encode(tok, text, strlen(text), false, &ids), VLMD_OK);
    cr_expect_gt(ids.n, 1, "split into ordinary tokens");
    for (size_t i = 0; i < ids.n; i++)
        cr_expect_not(vlmd_tokenizer_is_special(tok, ids.ids[i]));
    cr_expect_eq(vlmd_tokenizer_find(tok, "<|im_start|>"), 1011);
    cr_expect(vlmd_tokenizer_is_special(tok, 1011));
    vlmd_buf out = VLMD_BUF_INIT;
    uint32_t with_special[] = {1011, 64, 1012};
    vlmd_tokenizer_decode(tok, with_special, 3, true, &out, NULL);
    cr_expect_str_eq(out.data, "a", "skip_special drops them");
    vlmd_buf_free(&out);
    vlmd_tokens_free(&ids);
    vlmd_tokenizer_free(tok);
}

Test(tokenizer, bad_ids_and_invalid_utf8)
{
    vlmd_tokenizer *tok = load("qwen2");
    vlmd_buf out = VLMD_BUF_INIT;
    vlmd_error err = {0};
    uint32_t bad[] = {64, 999999};
    cr_expect_eq(vlmd_tokenizer_decode(tok, bad, 2, false, &out, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "999999"), "%s", err.msg);
    /* invalid UTF-8 input is tokenized byte-wise and decodes with U+FFFD */
    const char junk[] = "ok\xff\xfe\xc3";
    vlmd_tokens ids = {0};
    cr_assert_eq(vlmd_tokenizer_encode(tok, junk, sizeof junk - 1, true, &ids), VLMD_OK);
    vlmd_buf_clear(&out);
    cr_assert_eq(vlmd_tokenizer_decode(tok, ids.ids, ids.n, false, &out, NULL), VLMD_OK);
    cr_expect_str_eq(out.data, "ok\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    vlmd_tokens_free(&ids);
    vlmd_buf_free(&out);
    vlmd_tokenizer_free(tok);
}

Test(tokenizer, long_pieces_are_not_quadratic, .timeout = 10)
{
    vlmd_tokenizer *tok = load("qwen2");
    size_t n = 200000;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        text[i] = "ab"[i % 2]; /* one regex piece of 200k letters */
    text[n] = '\0';
    vlmd_tokens ids = {0};
    cr_assert_eq(vlmd_tokenizer_encode(tok, text, n, true, &ids), VLMD_OK);
    vlmd_buf out = VLMD_BUF_INIT;
    cr_assert_eq(vlmd_tokenizer_decode(tok, ids.ids, ids.n, false, &out, NULL), VLMD_OK);
    cr_expect_eq(out.len, n);
    cr_expect(memcmp(out.data, text, n) == 0);
    free(text);
    vlmd_buf_free(&out);
    vlmd_tokens_free(&ids);
    vlmd_tokenizer_free(tok);
}

Test(tokenizer, unsupported_files_are_refused)
{
    char path[] = "/tmp/vlmd-tok-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", f);
    fclose(f);
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_tokenizer_load(path, &tok, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "Unigram"), "%s", err.msg);
    unlink(path);
}

Test(tokenizer, nfc_normalizer_composes_before_splitting)
{
    /* The demo tokenizer declares NFC, as Qwen's own tokenizer.json does. */
    char dir[] = "/tmp/vlmd-nfc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    bool unchanged;
    cr_assert_eq(vlmd_demo_model_write(dir, 0, &unchanged, NULL), VLMD_OK);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, NULL), VLMD_OK);
    const char composed[] = "caf\xc3\xa9", decomposed[] = "cafe\xcc\x81"; /* e + U+0301 */
    vlmd_tokens a = {0}, b = {0};
    vlmd_tokenizer_encode(tok, composed, sizeof composed - 1, true, &a);
    vlmd_tokenizer_encode(tok, decomposed, sizeof decomposed - 1, true, &b);
    cr_assert_eq(a.n, b.n);
    cr_expect_arr_eq(a.ids, b.ids, a.n * sizeof *a.ids, "the same text once normalized");
    vlmd_tokens_free(&a);
    vlmd_tokens_free(&b);
    vlmd_tokenizer_free(tok);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(tokenizer, unsupported_normalizer_is_refused)
{
    char path[] = "/tmp/vlmd-tok-norm-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fputs("{\"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
          " \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", f);
    fclose(f);
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_tokenizer_load(path, &tok, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "normalizer Lowercase"), "%s", err.msg);
    unlink(path);
}
