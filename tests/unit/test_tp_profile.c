/* test_tp_profile.c - the auto-profile of a tensor-parallel group of rank
 * processes (issue 22) on the CPU backend's simulated devices: rank 0 leads
 * (lm_lead) and runs the profile, rank 1 follows (lm_follow), each in a
 * forked process joined by the CPU communicator. The KV target is the
 * smallest device's: a group of 96 and 64 MiB devices places the cache a
 * group of two 64 MiB devices does, and fewer tokens than two of 96 MiB. One
 * rank failing an attempt fails it on all: rank 1's device loses most of its
 * room just before the first rebuild (rank 0's profile hook asks, through
 * memory the ranks share), the attempt fails on rank 0 too, and the second
 * attempt, 5% smaller, succeeds once the room is back; the validation's
 * steps ran on both ranks, and rank 1 ends when rank 0 frees its model. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm.h"
#include "profile.h"
#include "test_ranks.h"
#include "test_support.h"

#define WORLD 2
#define WAIT_S 120
#define CANARY (8ull << 20)

typedef struct shared {
    char msg[WORLD][1200];          /* why a rank failed */
    int64_t tokens;                 /* rank 0's profile */
    uint64_t total_bytes;
    int attempts;
    char last_warning[1200];
    /* the attempt hook's handshake: rank 0 asks (1: take the room, 2: give it back),
     * rank 1's helper thread answers with the same number once done */
    _Atomic int ask, done;
} shared;

static void on_emit(const engine_output *o, void *ud)
{
    (void)o, (void)ud;
}

/* Waits (bounded) until rank 1 has done what rank 0 asked. */
static void ask_rank1(shared *sh, int what)
{
    atomic_store(&sh->ask, what);
    int64_t deadline = test_now_ms() + 10000;
    while (atomic_load(&sh->done) != what && test_now_ms() < deadline)
        usleep(1000);
}

/* Before each rebuild attempt: the first finds rank 1 without room, the second with it again. */
static void squeeze_rank1(int attempt, void *ud)
{
    if (attempt < 2)
        ask_rank1(ud, attempt + 1);
}

typedef struct helper {
    shared *sh;
    vlmd_backend *b;
} helper;

/* Rank 1, beside its lm_follow (idle then, waiting for rank 0's next word):
 * takes all but 1 MiB of its free room when asked, gives it back when asked. */
static void *take_room(void *arg)
{
    helper *h = arg;
    int64_t deadline = test_now_ms() + WAIT_S * 1000, taken = 0;
    for (int step = 1; step <= 2 && test_now_ms() < deadline;) {
        if (atomic_load(&h->sh->ask) != step) {
            usleep(1000);
            continue;
        }
        if (step == 1) {
            uint64_t free_bytes = 0, total = 0;
            vlmd_backend_mem_info(h->b, &free_bytes, &total, NULL);
            taken = (int64_t)free_bytes - (1 << 20);
        }
        vlmd_backend_take_hidden(h->b, step == 1 ? taken : -taken);
        atomic_store(&h->sh->done, step++);
    }
    return NULL;
}

static int fail(shared *sh, int rank, const vlmd_error *err)
{
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", err->msg);
    return 1;
}

static void rank_main(const vlmd_comm_id *id, int rank, const uint64_t *device_mib, bool squeeze,
                      shared *sh)
{
    vlmd_backend *b = NULL;
    vlmd_comm *c = NULL;
    vlmd_safetensors *st = NULL;
    vlmd_model_config mc;
    lm_model *m = NULL;
    vlmd_error err = {0};
    int code = 0;
    vlmd_comm_options o = {.rank = rank, .world = WORLD, .timeout_ms = 30000};
    if (vlmd_backend_create("cpu", &b, &err) != VLMD_OK ||
        vlmd_comm_create(b, id, &o, &c, &err) != VLMD_OK ||
        vlmd_model_config_load(test_fixture("qwen2"), &mc, &err) != VLMD_OK ||
        vlmd_safetensors_open_dir(test_fixture("qwen2"), &st, &err) != VLMD_OK)
        _exit(fail(sh, rank, &err));
    vlmd_backend_limit(b, device_mib[rank] << 20);
    lm_parallel par = {rank, WORLD, c};
    if (lm_load_rank(b, &mc, st, &par, &m, &err) != VLMD_OK)
        _exit(fail(sh, rank, &err));
    if (rank == 0) {
        engine_config cfg = {.max_batch_tokens = 256, .max_running = 8, .eos_id = -1,
                             .max_model_len = 1024, .image_token_id = -1};
        profile_config pc = {.mem_fraction = 0.9, .canary_bytes = CANARY};
        engine *e = NULL;
        void *canary = NULL;
        profile_report rep;
        if (lm_lead(m, &err) != VLMD_OK ||
            profile_run(m, b, &cfg, on_emit, NULL, &pc, squeeze ? squeeze_rank1 : NULL, sh, &e,
                        &canary, &rep, &err) != VLMD_OK)
            code = fail(sh, rank, &err);
        else
            sh->tokens = rep.tokens, sh->total_bytes = rep.total_bytes, sh->attempts = rep.attempts;
        engine_free(e);
        vlmd_backend_free(b, canary, CANARY);
    } else {
        helper h = {sh, b};
        pthread_t t;
        if (squeeze)
            pthread_create(&t, NULL, take_room, &h);
        if (lm_follow(m, &err) != VLMD_OK)
            code = fail(sh, rank, &err);
        if (squeeze)
            pthread_join(t, NULL);
    }
    lm_free(m); /* rank 0's ends rank 1's lm_follow */
    vlmd_safetensors_close(st);
    vlmd_comm_destroy(c);
    vlmd_backend_destroy(b);
    _exit(code);
}

/* Runs a group on devices of these sizes; every rank must exit 0. */
static void run_group(uint64_t mib0, uint64_t mib1, bool squeeze, shared *sh)
{
    memset(sh, 0, sizeof *sh);
    char dir[64];
    vlmd_comm_id id;
    test_group_id("tp-profile", &dir, &id);
    const uint64_t device_mib[WORLD] = {mib0, mib1};
    pid_t pids[WORLD];
    for (int r = 0; r < WORLD; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0, "fork: %s", strerror(errno));
        if (pids[r] == 0)
            rank_main(&id, r, device_mib, squeeze, sh);
    }
    int codes[WORLD];
    test_wait_group(pids, WORLD, WAIT_S, codes);
    cr_expect_eq(rmdir(dir), 0, "%s is not empty after the group: %s", dir, strerror(errno));
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(codes[r], 0, "rank %d (%llu and %llu MiB) exited %d: %s", r,
                     (unsigned long long)mib0, (unsigned long long)mib1, codes[r], sh->msg[r]);
}

static shared *shared_map(void)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                      0);
    cr_assert_neq(sh, MAP_FAILED);
    return sh;
}

Test(tp_profile, the_kv_target_is_the_smallest_devices)
{
    shared *sh = shared_map();
    run_group(96, 64, false, sh);
    int64_t mixed = sh->tokens;
    uint64_t mixed_total = sh->total_bytes;
    run_group(64, 64, false, sh);
    int64_t small = sh->tokens;
    run_group(96, 96, false, sh);
    int64_t large = sh->tokens;
    cr_expect_gt(mixed, 0);
    cr_expect_eq(mixed, small, "96 + 64 MiB: %lld tokens, as two of 64 MiB (%lld)",
                 (long long)mixed, (long long)small);
    cr_expect_lt(mixed, large, "two of 96 MiB hold more: %lld", (long long)large);
    cr_expect_lt(mixed_total, 96ull << 20, "rank 0's device taken as the smaller one's room");
    munmap(sh, sizeof *sh);
}

Test(tp_profile, one_rank_without_room_fails_the_attempt_on_all)
{
    shared *sh = shared_map();
    run_group(96, 96, false, sh);
    int64_t roomy = sh->tokens;
    cr_assert_eq(sh->attempts, 1);
    run_group(96, 96, true, sh);
    cr_expect_eq(sh->attempts, 2, "the first attempt failed on rank 1, so on rank 0 too");
    cr_expect_eq(sh->tokens, roomy * 95 / 100, "the second attempt is 5%% smaller: %lld of %lld",
                 (long long)sh->tokens, (long long)roomy);
    munmap(sh, sizeof *sh);
}
