/* test_support.h - what several unit tests share. */
#ifndef VLMD_TEST_SUPPORT_H
#define VLMD_TEST_SUPPORT_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "safetensors.h"

/* The device of the tests that are not about one: the CPU, or the emulated
 * CUDA device where tests/cuda_emu builds a test with TEST_DEVICE="cuda". */
#ifndef TEST_DEVICE
#define TEST_DEVICE "cpu"
#endif

/* Opens the backend `device` on *out, or says false where "cuda" is refused
 * clearly (a build or a machine without a GPU). Under tests/cuda_emu the
 * emulated device is always there: a refusal fails the test. The CUDA
 * backend's ways are the llm worker's flags in $VLMD_TEST_FLAGS (e.g.
 * "--cuda-attention wmma --cuda-pdl on": how CI and tools/device run the
 * tests again with each way), parsed by the flag table as the worker would. */
static inline bool test_backend_open_pdl(const char *device, int pdl, vlmd_backend **out);
static inline bool test_backend_open(const char *device, vlmd_backend **out)
{
    return test_backend_open_pdl(device, -1, out);
}

/* The same with --cuda-pdl off (pdl 0) or on (1) whatever the flags say (-1:
 * as they say). */
static inline bool test_backend_open_pdl(const char *device, int pdl, vlmd_backend **out)
{
    vlmd_error err = {0};
    vlmd_config cfg;
    vlmd_config_init_defaults(&cfg);
    char flags[512] = "", *argv[32];
    int argc = 0;
    const char *env = getenv("VLMD_TEST_FLAGS");
    cr_assert(!env || strlen(env) < sizeof flags, "VLMD_TEST_FLAGS is too long");
    if (env)
        strcpy(flags, env);
    for (char *save = NULL, *w = strtok_r(flags, " ", &save); w && argc < 32;
         w = strtok_r(NULL, " ", &save))
        argv[argc++] = w;
    cr_assert_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, argc, argv, 0, NULL, &err), VLMD_OK,
                 "VLMD_TEST_FLAGS: %s", err.msg);
    vlmd_backend_options o = vlmd_backend_options_of(&cfg);
    o.device = device;
    if (pdl >= 0)
        o.pdl = pdl;
    vlmd_status st = vlmd_backend_open(&o, out, &err);
    vlmd_config_free(&cfg);
    if (st == VLMD_OK)
        return true;
#ifdef VLMD_CUDA_EMULATED
    cr_assert_fail("the emulated CUDA device did not open: %s", err.msg);
#endif
    cr_assert_str_eq(device, "cuda", "%s", err.msg);
    cr_expect(strstr(err.msg, "--device cuda"), "a clear refusal: %s", err.msg);
    return false;
}

/* tests/fixtures/REL: under $VLMD_FIXTURES_DIR when set (a bundle run on
 * another machine), else in the source tree. Returns a static buffer. */
static inline const char *test_fixture(const char *rel)
{
    static char path[4096];
    const char *dir = getenv("VLMD_FIXTURES_DIR");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : VLMD_FIXTURES_DIR, rel);
    return path;
}

/* tests/fixtures/MODEL/FILE (the same static buffer). */
static inline const char *test_model_file(const char *model, const char *file)
{
    char rel[512];
    snprintf(rel, sizeof rel, "%s/%s", model, file);
    return test_fixture(rel);
}

/* A fixture model's reference.json (the caller decrefs it). */
static inline json_t *test_reference_json(const char *model)
{
    json_error_t je;
    json_t *r = json_load_file(test_model_file(model, "reference.json"), JSON_ALLOW_NUL, &je);
    cr_assert_not_null(r, "%s/reference.json: %s", model, je.text);
    return r;
}

/* A fixture model's reference.safetensors (the caller closes it). */
static inline vlmd_safetensors *test_reference_tensors(const char *model)
{
    vlmd_safetensors *st = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, "reference.safetensors"), &st,
                                            &err), VLMD_OK, "%s", err.msg);
    return st;
}

/* ||got - want|| / ||want|| over n floats: how the tests compare with the
 * fixtures' references (their README's tolerances are of this kind). */
static inline double test_rel_error(const float *got, const float *want, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
    }
    return sqrt(diff / norm);
}

#endif
