/* dataset.c - random and ShareGPT prompts for vlmd-bench. */
#include "dataset.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "random_image.h"
#include "rng.h"

void bench_dataset_free(bench_dataset *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->prompts[i].text);
        free(d->prompts[i].ids);
        free(d->prompts[i].image);
    }
    free(d->prompts);
    *d = (bench_dataset){0};
}

/* The text of ids (a vlmd_buf's bytes are NUL-terminated), now the caller's. */
static char *decoded(const vlmd_tokenizer *tok, const uint32_t *ids, size_t n, vlmd_error *err)
{
    vlmd_buf b = VLMD_BUF_INIT;
    if (vlmd_tokenizer_decode(tok, ids, n, false, &b, err) != VLMD_OK) {
        vlmd_buf_free(&b);
        return NULL;
    }
    char *text = b.data ? b.data : strdup("");
    if (!text)
        vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for a prompt's text");
    return text;
}

vlmd_status bench_random_dataset(const vlmd_tokenizer *tok, size_t n, int32_t input_len,
                                 int32_t output_len, double range_ratio, uint64_t seed,
                                 bench_dataset *out, vlmd_error *err)
{
    *out = (bench_dataset){0};
    uint32_t vocab = vlmd_tokenizer_size(tok);
    out->prompts = calloc(n, sizeof *out->prompts);
    if (!out->prompts)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for %zu prompts", n);
    out->n = n;
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) {
        bench_prompt *p = &out->prompts[i];
        double lo = input_len * (1 - range_ratio), hi = input_len * (1 + range_ratio);
        p->n_ids = (size_t)fmax(1, floor(lo + (hi - lo + 1) * bench_uniform(&rng)));
        lo = output_len * (1 - range_ratio), hi = output_len * (1 + range_ratio);
        p->output_len = (int32_t)fmax(1, floor(lo + (hi - lo + 1) * bench_uniform(&rng)));
        p->ids = malloc(p->n_ids * sizeof *p->ids);
        if (!p->ids) {
            bench_dataset_free(out);
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for prompt %zu", i);
        }
        for (size_t k = 0; k < p->n_ids; k++) {
            uint32_t id;
            do /* text ids only: a special token mid-prompt is not what users send */
                id = (uint32_t)(bench_uniform(&rng) * vocab);
            while (vlmd_tokenizer_is_special(tok, id));
            p->ids[k] = id;
        }
        p->prompt_len = (int32_t)p->n_ids;
        if (!(p->text = decoded(tok, p->ids, p->n_ids, err))) {
            bench_dataset_free(out);
            return err->status;
        }
    }
    return VLMD_OK;
}

static int32_t token_count(const vlmd_tokenizer *tok, const char *text)
{
    vlmd_tokens t = {0};
    if (vlmd_tokenizer_encode(tok, text, strlen(text), VLMD_SPECIAL_SPLIT, &t) != VLMD_OK)
        return -1;
    int32_t n = (int32_t)t.n;
    vlmd_tokens_free(&t);
    return n;
}

/* The first two turns' texts, or false when the entry has no such pair. */
static bool first_pair(const json_t *entry, const char **prompt, const char **reply)
{
    const json_t *conv = json_object_get(entry, "conversations");
    if (!json_is_array(conv) || json_array_size(conv) < 2)
        return false;
    *prompt = json_string_value(json_object_get(json_array_get(conv, 0), "value"));
    *reply = json_string_value(json_object_get(json_array_get(conv, 1), "value"));
    return *prompt && *reply;
}

vlmd_status bench_sharegpt_dataset(const vlmd_tokenizer *tok, const char *path, size_t n,
                                   int32_t fixed_output_len, uint64_t seed, bench_dataset *out,
                                   vlmd_error *err)
{
    *out = (bench_dataset){0};
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: line %d: %s", path, je.line, je.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: not a JSON list of conversations",
                           path);
    }
    size_t total = json_array_size(root);
    size_t *order = malloc((total ? total : 1) * sizeof *order);
    out->prompts = calloc(n ? n : 1, sizeof *out->prompts);
    if (!order || !out->prompts) {
        free(order);
        json_decref(root);
        bench_dataset_free(out);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    uint64_t rng = seed;
    for (size_t i = 0; i < total; i++)
        order[i] = i;
    for (size_t i = total; i > 1; i--) { /* Fisher-Yates */
        size_t j = (size_t)(bench_uniform(&rng) * (double)i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    vlmd_status s = VLMD_OK;
    for (size_t i = 0; i < total && out->n < n && s == VLMD_OK; i++) {
        const char *prompt, *reply;
        if (!first_pair(json_array_get(root, order[i]), &prompt, &reply))
            continue;
        int32_t in = token_count(tok, prompt), gen = token_count(tok, reply);
        if (fixed_output_len > 0)
            gen = fixed_output_len;
        if (in < 4 || gen < 4 || in > 1024 || in + gen > 2048)
            continue;
        bench_prompt *p = &out->prompts[out->n];
        if (!(p->text = strdup(prompt))) {
            s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
            break;
        }
        p->prompt_len = in;
        p->output_len = gen;
        out->n++;
    }
    free(order);
    json_decref(root);
    if (s == VLMD_OK && out->n < n)
        s = vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                        "%s: %zu usable conversations (first turn 4-1024 tokens, reply at least "
                        "4, both at most 2048), %zu asked for", path, out->n, n);
    if (s != VLMD_OK)
        bench_dataset_free(out);
    return s;
}

vlmd_status bench_attach_images(bench_dataset *d, double ratio, int width, int height,
                                uint64_t seed, vlmd_error *err)
{
    uint64_t rng = seed ^ 0x5bd1e995ull; /* not the prompts' stream */
    for (size_t i = 0; i < d->n; i++) {
        if (bench_uniform(&rng) >= ratio)
            continue;
        if (!(d->prompts[i].image = bench_random_image_uri(width, height, &rng)))
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for image %zu", i);
    }
    return VLMD_OK;
}
