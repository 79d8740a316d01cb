/* fuzz_api_request.c - libFuzzer target: any bytes as the body of
 * /v1/chat/completions, /v1/completions and /v1/responses (and of
 * /v1/embeddings, /v1/rerank and /v1/score), through the JSON
 * parser, the validators, each family's chat template and the tokenizer (the
 * qwen2 fixture's), with the server's default limits and (for
 * previous_response_id) a store holding "resp_fuzz". Bad input must only ever
 * be a 4xx. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "api_request.h"
#include "pooling.h"
#include "responses.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static vlmd_tokenizer *tok;
static responses_store *store;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (vlmd_tokenizer_load(VLMD_FIXTURES_DIR "/qwen2/tokenizer.json", &tok, NULL) != VLMD_OK)
        abort();
    responses_store_limits sl = {.max_entries = 4, .max_bytes = 1 << 20, .ttl_ms = UINT64_MAX};
    json_t *items = json_loads("[{\"type\": \"message\", \"role\": \"user\", \"content\": "
                               "\"hi\"}, {\"type\": \"function_call\", \"call_id\": \"c\", "
                               "\"name\": \"f\", \"arguments\": \"{}\"}]", 0, NULL);
    store = responses_store_create(&sl);
    if (!store || !responses_store_put(store, "resp_fuzz", json_object(), items, 0))
        abort();
    return 0;
}

/* A refusal is the client's error (500 only for out of memory). */
static void check_refusal(const api_error *e)
{
    if (e->status < 400 || (e->status >= 500 && e->status != 500))
        abort();
}

/* The pooling endpoints: accepted inputs each have tokens within the length. */
static void fuzz_pooling(const json_t *body, const api_limits *lim)
{
    static completions c;
    c.tok = tok;
    c.limits = *lim;
    c.task = (vlmd_model_task){.task = VLMD_TASK_EMBED, .normalize = true, .matryoshka = true};
    pooling_model pm = {.c = &c, .hidden_size = 64, .yes_id = 1, .no_id = 2};
    api_request r = {0};
    api_error e;
    embed_answer a;
    if (embeddings_parse(body, &pm, &r, &a, &e)) {
        if (r.n_prompts == 0 || r.n_prompts > POOLING_MAX_INPUTS || a.dimensions == 0 ||
            a.dimensions > 64 || r.pooling != VLMD_POOL_LAST_HIDDEN)
            abort();
        for (uint32_t i = 0; i < r.n_prompts; i++)
            if (r.prompts[i].n == 0 || r.prompts[i].n > 4096)
                abort();
    } else {
        check_refusal(&e);
    }
    api_request_free(&r);
    for (int score = 0; score < 2; score++) {
        rerank_answer ra = {0};
        r = (api_request){0};
        if (rerank_parse(body, &pm, score, &r, &ra, &e)) {
            if (r.n_prompts == 0 || r.n_prompts != json_array_size(ra.documents) ||
                r.n_pool_ids != 2)
                abort();
            for (uint32_t i = 0; i < r.n_prompts; i++)
                if (r.prompts[i].n == 0 || r.prompts[i].n > 4096)
                    abort();
        } else {
            check_refusal(&e);
        }
        api_request_free(&r);
        json_decref(ra.documents);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = json_loadb((const char *)data, size, API_JSON_FLAGS, NULL);
    if (!body)
        return 0;
    api_limits lim = {.model_name = "qwen2", .max_model_len = 4096, .max_images = 8,
                      .image_token_id = -1, .max_messages = 1024, .max_prompt_bytes = 1 << 20,
                      .defaults = {.temperature = 1, .top_p = 1, .top_k = -1,
                                   .repetition_penalty = 1}};
    static const char *const families[] = {"qwen2", "qwen2_5", "qwen3", "qwen3_vl"};
    for (int run = 0; run < 1 + 4; run++) { /* completions, then chat in each family */
        bool chat = run > 0;
        lim.chat_family = chat ? vlmd_chat_family_find(families[run - 1]) : NULL;
        if (chat && !lim.chat_family)
            abort();
        api_request r;
        api_error e;
        if (api_request_parse(body, chat, &lim, tok, &r, &e)) {
            /* an accepted request has prompts and, once its images are measured
             * (not here: no image is fetched), room to answer; at most 128 choices */
            if (r.n_prompts == 0 || r.n * r.n_prompts > API_MAX_N ||
                (!r.n_images && r.max_tokens == 0))
                abort();
            for (uint32_t i = 0; i < r.n_prompts; i++)
                if (r.prompts[i].n == 0 || (!r.n_images && r.prompts[i].n >= 4096))
                    abort();
            api_request_free(&r);
        } else if (e.status < 400 || (e.status >= 500 && e.status != 500)) {
            abort(); /* refused input is the client's error (500 only for out of memory) */
        }
    }
    lim.chat_family = NULL;
    api_request r;
    responses_job *job;
    api_error e;
    if (responses_request_parse(body, &lim, tok, store, 0, &r, &job, &e)) {
        if (r.n_prompts != 1 || r.n != 1 || r.prompts[0].n == 0 || !job ||
            (!r.n_images && (r.max_tokens == 0 || r.prompts[0].n >= 4096)))
            abort();
        api_request_free(&r);
        responses_job_free(job);
    } else if (e.status < 400 || (e.status >= 500 && e.status != 500) || job) {
        abort();
    }
    fuzz_pooling(body, &lim);
    json_decref(body);
    return 0;
}
