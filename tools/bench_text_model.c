/* bench_text_model.c - the benchmarks' model loading and random prompts. */
#include "bench_text_model.h"

#include "clock.h"
#include "safetensors.h"

vlmd_status bench_text_model_load(const char *dir, const vlmd_backend_options *o,
                                  bench_text_model *out, vlmd_error *err)
{
    *out = (bench_text_model){0};
    vlmd_safetensors *st = NULL;
    uint64_t t0 = vlmd_now_ns();
    vlmd_status s = vlmd_model_config_load(dir, &out->mc, err);
    if (s == VLMD_OK)
        s = vlmd_backend_open(o, &out->backend, err);
    if (s == VLMD_OK)
        s = vlmd_safetensors_open_dir(dir, &st, err);
    if (s == VLMD_OK)
        s = lm_load(out->backend, &out->mc, st, &out->model, err);
    vlmd_safetensors_close(st);
    if (s != VLMD_OK) {
        bench_text_model_free(out);
        return s;
    }
    out->load_s = (double)(vlmd_now_ns() - t0) / 1e9;
    out->weight_bytes = vlmd_backend_allocated_bytes(out->backend);
    return VLMD_OK;
}

void bench_text_model_free(bench_text_model *t)
{
    lm_free(t->model);
    vlmd_backend_destroy(t->backend);
    *t = (bench_text_model){0};
}

void bench_random_ids(uint64_t *state, uint32_t *ids, int64_t n, uint32_t vocab)
{
    for (int64_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (uint32_t)((*state >> 33) % vocab);
    }
}
