/* test_backend.c - the backend interface: device info, counted allocations,
 * copies, the CPU's simulated device and its default size. The CUDA checks run where a GPU is visible; elsewhere the CUDA
 * backend must refuse with a clear error and "auto" must fall back to CPU. */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "host_memory.h"
#include "config.h"

static void roundtrip(vlmd_backend *b)
{
    uint64_t before = vlmd_backend_alloc_count(b);
    size_t n = 1 << 20;
    void *dev = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_alloc(b, n, &dev, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_backend_alloc_count(b), before + 1, "every allocation is counted");
    cr_expect_eq(vlmd_backend_allocated_bytes(b), n);
    unsigned char *in = malloc(n), *out = malloc(n);
    for (size_t i = 0; i < n; i++)
        in[i] = (unsigned char)(i * 131 + 7);
    memset(out, 0xee, n);
    cr_assert_eq(vlmd_backend_copy_to_device(b, dev, in, n, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_copy_to_host(b, out, dev, n, &err), VLMD_OK, "%s", err.msg);
    cr_expect_arr_eq(in, out, n, "bytes survive the round trip");
    vlmd_backend_free(b, dev, n);
    cr_expect_eq(vlmd_backend_allocated_bytes(b), 0);
    cr_expect_eq(vlmd_backend_alloc_count(b), before + 1, "freeing does not uncount");
    free(in);
    free(out);
}

Test(backend, cpu)
{
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    const vlmd_device_info *info = vlmd_backend_info(b);
    cr_expect_eq(info->kind, VLMD_DEVICE_CPU);
    cr_expect(strncmp(info->name, "cpu", 3) == 0, "%s", info->name);
    uint64_t free_bytes = 0, total = 0;
    cr_assert_eq(vlmd_backend_mem_info(b, &free_bytes, &total, &err), VLMD_OK);
    cr_expect_gt(total, 0);
    cr_expect_leq(free_bytes, total);
    cr_expect_not(vlmd_backend_ops_take_memory(b), "CPU ops use only the buffers they are given");
    roundtrip(b);
    vlmd_backend_destroy(b);
}

Test(backend, owned_allocations_are_freed_together)
{
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    vlmd_backend_limit(b, 1 << 20);
    vlmd_backend_owned o = {0};
    void *p[40];
    /* more blocks than the list's first capacity, and an empty one */
    for (int i = 0; i < 40; i++) {
        cr_assert_eq(vlmd_backend_alloc_owned(b, &o, i == 0 ? 0 : 1000, &p[i], &err), VLMD_OK,
                     "%s", err.msg);
        cr_assert_not_null(p[i], "a zero-byte buffer still has an address");
    }
    cr_expect_eq(vlmd_backend_allocated_bytes(b), 4 + 39 * 1000);
    void *big = (void *)1;
    cr_expect_eq(vlmd_backend_alloc_owned(b, &o, 2 << 20, &big, &err), VLMD_ERR_NOMEM);
    cr_expect_null(big);
    cr_expect_eq(o.n, 40, "a failed allocation is not recorded");
    void *taken = NULL;
    cr_assert_eq(vlmd_backend_alloc(b, 500, &taken, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_own(b, &o, taken, 500, &err), VLMD_OK, "%s", err.msg);
    vlmd_backend_free_owned(b, &o);
    cr_expect_eq(vlmd_backend_allocated_bytes(b), 0, "every owned block was freed");
    cr_expect_eq(o.n, 0);
    cr_expect_null(o.blocks);
    vlmd_backend_destroy(b);
}

#define GIB (1ull << 30)

/* --cpu-device-mb 0: the available memory, within a cgroup's limit, less a
 * tenth of it (1 GiB at least), never below the flag's 64 MiB. */
Test(backend, the_cpu_devices_default_is_spare_memory_less_a_margin)
{
    vlmd_host_memory hm;
    vlmd_host_memory_plan(32 * GIB, 20 * GIB, 0, &hm);
    cr_expect_eq(hm.room, 20 * GIB);
    cr_expect_eq(hm.margin, 2 * GIB, "a tenth");
    cr_expect_eq(hm.device, 18 * GIB);
    vlmd_host_memory_plan(32 * GIB, 20 * GIB, 8 * GIB, &hm);
    cr_expect_eq(hm.limit, 8 * GIB);
    cr_expect_eq(hm.room, 8 * GIB, "the cgroup's limit binds");
    cr_expect_eq(hm.device, 7 * GIB, "less 1 GiB: a tenth is less");
    vlmd_host_memory_plan(32 * GIB, 20 * GIB, 1ull << 62, &hm);
    cr_expect_eq(hm.limit, 0, "an unlimited cgroup reports a huge limit");
    cr_expect_eq(hm.device, 18 * GIB);
    vlmd_host_memory_plan(4 * GIB, GIB / 2, 0, &hm);
    cr_expect_eq(hm.device, VLMD_HOST_DEVICE_MIN, "never below --cpu-device-mb's minimum");
    cr_expect_eq(vlmd_cpu_device_bytes(512), 512ull << 20, "a given size is taken as it is");
    vlmd_host_memory_read(&hm);
    cr_expect_gt(hm.total, 0);
    cr_expect_leq(hm.available, hm.total);
    cr_expect_leq(hm.device, hm.total);
    cr_expect_geq(vlmd_cpu_device_bytes(0), VLMD_HOST_DEVICE_MIN);
}

Test(backend, bad_device_name)
{
    vlmd_backend *b = (vlmd_backend *)1;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_backend_create("tpu", &b, &err), VLMD_ERR_INVALID_ARG);
    cr_expect_null(b);
    cr_expect(strstr(err.msg, "'tpu'"), "%s", err.msg);
}

Test(backend, cuda_where_there_is_one_and_a_clear_refusal_elsewhere)
{
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    vlmd_status st = vlmd_backend_create("cuda", &b, &err);
    if (st != VLMD_OK) {
        cr_expect_eq(st, VLMD_ERR_UNAVAILABLE, "%s", err.msg);
        cr_expect(strstr(err.msg, "--device cuda"), "%s", err.msg);
        cr_expect_null(b);
        /* and auto falls back to the CPU */
        cr_assert_eq(vlmd_backend_create("auto", &b, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(vlmd_backend_info(b)->kind, VLMD_DEVICE_CPU);
        vlmd_backend_destroy(b);
        return;
    }
    cr_expect(vlmd_backend_cuda_built());
    const vlmd_device_info *info = vlmd_backend_info(b);
    cr_expect_eq(info->kind, VLMD_DEVICE_CUDA);
    cr_expect_geq(info->cc_major, 7, "%s sm_%d%d", info->name, info->cc_major, info->cc_minor);
    cr_expect_gt(info->total_bytes, 1ull << 30);
    uint64_t free_bytes = 0, total = 0;
    cr_assert_eq(vlmd_backend_mem_info(b, &free_bytes, &total, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(total, info->total_bytes);
    cr_expect(vlmd_backend_ops_take_memory(b), "lazily loaded kernels, cuBLAS's workspace");
    roundtrip(b);
    /* An allocation the device cannot hold is a status naming the size, not a crash. */
    void *p = NULL;
    cr_expect_eq(vlmd_backend_alloc(b, (size_t)1 << 50, &p, &err), VLMD_ERR_NOMEM);
    cr_expect(strstr(err.msg, "1125899906842624"), "%s", err.msg);
    cr_expect_eq(vlmd_backend_allocated_bytes(b), 0);
    vlmd_backend_destroy(b);
    /* auto picks the GPU */
    cr_assert_eq(vlmd_backend_create("auto", &b, &err), VLMD_OK);
    cr_expect_eq(vlmd_backend_info(b)->kind, VLMD_DEVICE_CUDA);
    vlmd_backend_destroy(b);
}

/* --threads: the CPU backend's pool takes the size asked, 0 the cores the
 * process may run on; the weight type follows the first holder and another
 * type is refused while it holds, naming both. */
Test(backend, cpu_threads_and_weight_types)
{
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    cr_expect_eq(vlmd_backend_threads(b), CPU_COUNT(&set), "the default is the affinity's cores");
    cr_assert_eq(vlmd_backend_set_threads(b, 3, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_backend_threads(b), 3);
    cr_assert_eq(vlmd_backend_set_threads(b, 0, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_backend_threads(b), CPU_COUNT(&set));
    cr_expect_neq(vlmd_backend_isa(b)[0], '\0');

    cr_expect_eq(vlmd_backend_weight_dtype(b), VLMD_DTYPE_F32);
    cr_assert_eq(vlmd_backend_hold_weight_dtype(b, VLMD_DTYPE_BF16, &err), VLMD_OK);
    cr_expect_eq(vlmd_backend_weight_elem_size(b), 2);
    cr_expect_eq(vlmd_backend_kv_dtype(b), VLMD_DTYPE_BF16);
    cr_expect_eq(vlmd_backend_elem_size(b), 4, "activations stay fp32");
    cr_expect_eq(vlmd_backend_hold_weight_dtype(b, VLMD_DTYPE_F32, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "BF16") && strstr(err.msg, "F32"), "%s", err.msg);
    vlmd_backend_release_weights(b);
    cr_assert_eq(vlmd_backend_hold_weight_dtype(b, VLMD_DTYPE_F32, &err), VLMD_OK);
    cr_expect_eq(vlmd_backend_kv_dtype(b), VLMD_DTYPE_F32, "an F32 checkpoint: the fp32 cache");
    vlmd_backend_release_weights(b);
    vlmd_backend_destroy(b);
}

/* Each rank's GPU: rank r's ordinal in --devices, or r when it is empty; a
 * list that is not ordinals, or names fewer than the ranks, is refused. */
Test(backend, a_ranks_gpu_comes_from_devices)
{
    vlmd_config cfg;
    vlmd_error err = {0};
    vlmd_config_init_defaults(&cfg);
    char *two[] = {"--tensor-parallel-size", "3", "--rank", "2"};
    cr_assert_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, 4, two, 0, NULL, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(vlmd_backend_options_of(&cfg).ordinal, 2, "rank r on GPU r");
    char *list[] = {"--devices", "4,6,7", "--model", "m", "--router-endpoint", "ipc:///r"};
    cr_assert_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, 6, list, 0, NULL, &err), VLMD_OK);
    cr_assert_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_backend_options_of(&cfg).ordinal, 7);
    cfg.rank = 0;
    cr_expect_eq(vlmd_backend_options_of(&cfg).ordinal, 4);
    /* two engines of three ranks: engine 1's rank 1 is the fifth process */
    char *engines[] = {"--devices", "0,1,2,3,5,4", "--data-parallel-size", "2",
                       "--data-parallel-rank", "1", "--rank", "1"};
    cr_assert_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, 8, engines, 0, NULL, &err), VLMD_OK);
    cr_assert_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_config_process_rank(&cfg), 4);
    cr_expect_eq(vlmd_backend_options_of(&cfg).ordinal, 5);
    char *short_list[] = {"--devices", "0,1,2,3,4"};
    cr_assert_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, 2, short_list, 0, NULL, &err), VLMD_OK);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "--data-parallel-size 2"), "%s", err.msg);
    cfg.data_parallel_size = 1;
    cfg.data_parallel_rank = 0;
    const char *bad[] = {"4,6", "4,x,7", "-1,2,3", "1,,2"};
    for (int i = 0; i < 4; i++) {
        char *argv[] = {"--devices", (char *)bad[i]};
        cr_assert_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, 2, argv, 0, NULL, &err), VLMD_OK);
        cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_ERR_INVALID_ARG,
                     "--devices %s", bad[i]);
        cr_expect(strstr(err.msg, "--devices"), "%s", err.msg);
    }
    vlmd_config_free(&cfg);
}

/* The CUDA backend's ways come from the workers' flags (the flag table, so
 * --help and /health show them), defaults first; the CPU backend opens with
 * any of them. */
Test(backend, cuda_ways_come_from_the_flags)
{
    vlmd_config cfg;
    vlmd_config_init_defaults(&cfg);
    vlmd_backend_options o = vlmd_backend_options_of(&cfg);
    cr_expect_str_eq(o.device, "auto");
    cr_expect(o.attention == VLMD_CUDA_ATTENTION_FA2 && !o.gemv_decode && !o.pdl);
    char *argv[] = {"--device", "cpu", "--cuda-attention", "wmma", "--cuda-decode-linear",
                    "gemv", "--cuda-pdl", "on"};
    vlmd_error err = {0};
    const vlmd_role readers[] = {VLMD_ROLE_LLM, VLMD_ROLE_VISUAL};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(vlmd_config_parse(&cfg, readers[i], 8, argv, 0, NULL, &err), VLMD_OK, "%s",
                     err.msg);
    o = vlmd_backend_options_of(&cfg);
    cr_expect(o.attention == VLMD_CUDA_ATTENTION_WMMA && o.gemv_decode && o.pdl);
    vlmd_backend *b = NULL;
    cr_expect_eq(vlmd_backend_open(&o, &b, &err), VLMD_OK, "%s", err.msg);
    vlmd_backend_destroy(b);
    vlmd_config_free(&cfg);
}
