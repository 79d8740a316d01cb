/* test_comm.c - the communicator (kernels/comm.h) against a single-process
 * reference. Each test forks N rank processes (N = 1 to 4) on the CPU
 * backend that join one group through a shared file in a fresh directory
 * under /dev/shm and run a sequence of operations (sizes 0, 1, odd, and
 * larger than the slots, so chunking runs); each rank writes what it got
 * into memory shared with the parent, which computes the reference itself:
 * fp32 sums in rank order bit for bit, bf16 summed in fp32 in rank order
 * and rounded once. Every child exits with a status and the parent waits
 * for them with a deadline (then kills them): a hang fails, never hangs.
 * Also: a rank that never joins, or dies, makes the others fail within the
 * timeout naming it; the shared file is gone once the group has joined and
 * the directory is empty after every test. The NCCL communicator refuses
 * clearly where there is no GPU (or no NCCL); with a GPU it runs N = 1. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "comm.h"
#include "test_ranks.h"

#define MAX_RANKS 4
#define OUT_BYTES (8u << 20)        /* what each rank reports, at most */
#define SMALL_SLOT 1024             /* halves of 512 bytes: 128 floats a round */
#define WAIT_S 60                   /* the parent's bound on a group */

/* What the ranks and the parent share (one anonymous shared mapping). */
typedef struct shared {
    int status[MAX_RANKS];          /* the vlmd_status a rank's step failed with */
    char msg[MAX_RANKS][1100];      /* a vlmd_error and a few words */
    int64_t elapsed_ms[MAX_RANKS];  /* from the start of the failing step to its failure */
    unsigned counter;               /* the barrier test's arrivals */
    unsigned char out[MAX_RANKS][OUT_BYTES];
} shared;

typedef struct group {
    int world;
    vlmd_comm_options o;            /* rank and world set per child */
    vlmd_comm_id id;
    char dir[64];
    shared *sh;
} group;

typedef int (*rank_fn)(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg);

static void group_init(group *g, int world, int timeout_ms, size_t slot_bytes)
{
    memset(g, 0, sizeof *g);
    g->world = world;
    g->o.timeout_ms = timeout_ms;
    g->o.cpu_slot_bytes = slot_bytes;
    test_group_id("comm-test", &g->dir, &g->id);
    g->sh = mmap(NULL, sizeof *g->sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(g->sh, MAP_FAILED);
}

/* Nothing may be left in the group's directory: removing it must succeed. */
static void group_end(group *g)
{
    int removed = rmdir(g->dir);
    cr_expect_eq(removed, 0, "%s is not empty after the group: %s", g->dir, strerror(errno));
    munmap(g->sh, sizeof *g->sh);
}

/* One rank's life: open the CPU backend, join, run fn, leave. The exit
 * status is fn's (0: as expected); a failed join is 10 (sh->msg says why). */
static void rank_main(group *g, int rank, rank_fn fn, const void *arg, bool joins_only)
{
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    if (vlmd_backend_create("cpu", &b, &err) != VLMD_OK) {
        snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "backend: %s", err.msg);
        _exit(11);
    }
    vlmd_backend_set_threads(b, 1, NULL);
    vlmd_comm_options o = g->o;
    o.rank = rank;
    o.world = g->world;
    vlmd_comm *c = NULL;
    int64_t t0 = test_now_ms();
    vlmd_status st = vlmd_comm_create(b, &g->id, &o, &c, &err);
    g->sh->status[rank] = st;
    g->sh->elapsed_ms[rank] = test_now_ms() - t0;
    if (st != VLMD_OK) {
        snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "%s", err.msg);
        vlmd_backend_destroy(b);
        _exit(10);
    }
    /* rank 0 unlinks the file once everyone has it mapped, before it
     * arrives at the next barrier */
    int code = 0;
    const char *path = (const char *)g->id.data;
    if (vlmd_comm_barrier(c, &err) != VLMD_OK) {
        snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "the first barrier: %s", err.msg);
        code = 13;
    } else if (access(path, F_OK) == 0 || errno != ENOENT) {
        snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "%s is still there after joining",
                 path);
        code = 12;
    }
    if (!joins_only && code == 0)
        code = fn(g, b, c, rank, arg);
    vlmd_comm_destroy(c);
    vlmd_backend_destroy(b);
    _exit(code);
}

/* Forks the ranks in `starts` (a bit per rank), waits for each with a
 * deadline (killing what is left), and returns each one's exit status in
 * codes (-1: killed or timed out). */
static void group_run(group *g, unsigned starts, rank_fn fn, const void *arg, int codes[])
{
    pid_t pids[MAX_RANKS] = {0};
    for (int r = 0; r < g->world; r++) {
        codes[r] = -1;
        if (!(starts & 1u << r))
            continue;
        pids[r] = fork();
        cr_assert_geq(pids[r], 0, "fork: %s", strerror(errno));
        if (pids[r] == 0)
            rank_main(g, r, fn, arg, fn == NULL);
    }
    int64_t deadline = test_now_ms() + WAIT_S * 1000;
    for (int r = 0; r < g->world; r++) {
        if (!pids[r])
            continue;
        bool killed;
        codes[r] = test_wait_rank(pids[r], deadline, &killed);
        if (killed)
            cr_log_error("rank %d did not finish within %d s: killed", r, WAIT_S);
    }
}

/* Every started rank exited 0. */
static void expect_all_ok(group *g, unsigned starts, const int codes[])
{
    for (int r = 0; r < g->world; r++)
        if (starts & 1u << r)
            cr_expect_eq(codes[r], 0, "world %d rank %d exited %d: %s", g->world, r, codes[r],
                         g->sh->msg[r]);
}

/* ---------------------------------------------------------------- inputs */

/* Rank r's element i of case k: signs, and magnitudes over 2^-8 .. 2^8, so
 * that the order of a sum shows in its bits. */
static float value(int k, int r, size_t i)
{
    uint64_t h = ((uint64_t)k * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)r << 40) ^ i;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    float m = 1.0f + (float)(h & 0xffffff) / (float)(1 << 24);
    int e = (int)((h >> 24) % 17) - 8;
    return ((h >> 40) & 1 ? -m : m) * ldexpf(1.0f, e);
}

/* bf16 by its definition: the top 16 bits, rounded to nearest even (the
 * inputs are never NaN). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Fills dst[n] with rank r's inputs of case k in dtype (dst may be at any
 * byte: the broadcast cases pack odd sizes one after another). */
static void fill(void *dst, vlmd_dtype dtype, int k, int r, size_t n)
{
    unsigned char *out = dst;
    for (size_t i = 0; i < n; i++) {
        float f = value(k, r, i);
        uint16_t h = to_bf16(f);
        if (dtype == VLMD_DTYPE_F32)
            memcpy(out + i * sizeof f, &f, sizeof f);
        else
            memcpy(out + i * sizeof h, &h, sizeof h);
    }
}

/* A rank's buffer in backend memory, filled from host. */
static void *to_device(vlmd_backend *b, const void *host, size_t bytes)
{
    void *dev = NULL;
    if (vlmd_backend_alloc(b, bytes ? bytes : 1, &dev, NULL) != VLMD_OK ||
        vlmd_backend_copy_to_device(b, dev, host, bytes, NULL) != VLMD_OK)
        _exit(20);
    return dev;
}

static int fail_rank(group *g, int rank, const char *what, const vlmd_error *err)
{
    snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "%s: %s", what, err->msg);
    return 1;
}

/* ------------------------------------------------------------ all-reduce */

typedef struct op_case {
    vlmd_dtype dtype;
    size_t count;
} op_case;

typedef struct cases {
    const op_case *c;
    int n;
} cases;

static const op_case reduce_cases[] = {
    {VLMD_DTYPE_F32, 1},    {VLMD_DTYPE_F32, 0},    {VLMD_DTYPE_F32, 7},
    {VLMD_DTYPE_F32, 129},  {VLMD_DTYPE_F32, 1001}, {VLMD_DTYPE_F32, 4099},
    {VLMD_DTYPE_BF16, 1},   {VLMD_DTYPE_BF16, 3},   {VLMD_DTYPE_BF16, 257},
    {VLMD_DTYPE_BF16, 4097},{VLMD_DTYPE_F32, 2},    {VLMD_DTYPE_BF16, 0},
};

/* Each case in turn, in place; the results one after another in sh->out. */
static int reduce_rank(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg)
{
    const cases *cs = arg;
    size_t at = 0;
    for (int k = 0; k < cs->n; k++) {
        size_t bytes = cs->c[k].count * vlmd_dtype_size(cs->c[k].dtype);
        unsigned char *host = g->sh->out[rank] + at;
        fill(host, cs->c[k].dtype, k, rank, cs->c[k].count);
        void *dev = to_device(b, host, bytes);
        vlmd_error err = {0};
        if (vlmd_comm_all_reduce_sum(c, dev, cs->c[k].count, cs->c[k].dtype, &err) != VLMD_OK)
            return fail_rank(g, rank, "all_reduce_sum", &err);
        vlmd_backend_copy_to_host(b, host, dev, bytes, NULL);
        vlmd_backend_free(b, dev, bytes ? bytes : 1);
        at += bytes;
    }
    return 0;
}

/* The parent's reference: every rank's inputs summed in rank order. */
static void expect_reduced(group *g, const cases *cs)
{
    size_t at = 0;
    for (int k = 0; k < cs->n; k++) {
        vlmd_dtype dt = cs->c[k].dtype;
        size_t n = cs->c[k].count, es = vlmd_dtype_size(dt);
        for (int r = 0; r < g->world; r++) {
            int bad = 0;
            for (size_t i = 0; i < n && bad < 3; i++) {
                float sum = 0;
                for (int q = 0; q < g->world; q++) {
                    float v = dt == VLMD_DTYPE_F32 ? value(k, q, i) : from_bf16(to_bf16(value(k, q, i)));
                    sum = q == 0 ? v : sum + v;
                }
                const unsigned char *got = g->sh->out[r] + at + i * es;
                uint32_t want_bits = 0, got_bits = 0;
                if (dt == VLMD_DTYPE_F32) {
                    memcpy(&want_bits, &sum, 4);
                    memcpy(&got_bits, got, 4);
                } else {
                    want_bits = to_bf16(sum);
                    uint16_t h;
                    memcpy(&h, got, 2);
                    got_bits = h;
                }
                if (want_bits != got_bits) {
                    bad++;
                    cr_expect_fail("world %d rank %d, %s x %zu, element %zu: bits %08x, the "
                                   "reference in rank order %08x", g->world, r,
                                   vlmd_dtype_str(dt), n, i, got_bits, want_bits);
                }
            }
        }
        at += n * es;
    }
}

static void all_reduce_in(int world, size_t slot_bytes, const cases *cs)
{
    group g;
    group_init(&g, world, 20000, slot_bytes);
    int codes[MAX_RANKS];
    unsigned all = (1u << world) - 1;
    group_run(&g, all, reduce_rank, cs, codes);
    expect_all_ok(&g, all, codes);
    expect_reduced(&g, cs);
    group_end(&g);
}

Test(comm, all_reduce_sums_in_rank_order_through_small_slots)
{
    cases cs = {reduce_cases, sizeof reduce_cases / sizeof reduce_cases[0]};
    for (int world = 1; world <= MAX_RANKS; world++)
        all_reduce_in(world, SMALL_SLOT, &cs);
}

Test(comm, all_reduce_larger_than_the_default_slot)
{
    /* 600000 floats: 2.4 MB through halves of 512 KiB */
    static const op_case big[] = {{VLMD_DTYPE_F32, 600001}, {VLMD_DTYPE_BF16, 700001}};
    cases cs = {big, 2};
    all_reduce_in(2, 0, &cs);
    all_reduce_in(3, 0, &cs);
}

/* ------------------------------------------------------------ all-gather */

static const op_case gather_cases[] = {
    {VLMD_DTYPE_F32, 1},    {VLMD_DTYPE_F32, 5},    {VLMD_DTYPE_F32, 0},
    {VLMD_DTYPE_F32, 1000}, {VLMD_DTYPE_BF16, 1},   {VLMD_DTYPE_BF16, 333},
    {VLMD_DTYPE_BF16, 2049},
};

/* Each rank's slice in place of world slices; the others' start as garbage. */
static int gather_rank(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg)
{
    const cases *cs = arg;
    size_t at = 0;
    for (int k = 0; k < cs->n; k++) {
        size_t es = vlmd_dtype_size(cs->c[k].dtype), slice = cs->c[k].count * es;
        size_t bytes = slice * (size_t)g->world;
        unsigned char *host = g->sh->out[rank] + at;
        memset(host, 0xab, bytes);
        fill(host + (size_t)rank * slice, cs->c[k].dtype, k, rank, cs->c[k].count);
        void *dev = to_device(b, host, bytes);
        vlmd_error err = {0};
        if (vlmd_comm_all_gather(c, dev, cs->c[k].count, cs->c[k].dtype, &err) != VLMD_OK)
            return fail_rank(g, rank, "all_gather", &err);
        vlmd_backend_copy_to_host(b, host, dev, bytes, NULL);
        vlmd_backend_free(b, dev, bytes ? bytes : 1);
        at += bytes;
    }
    return 0;
}

Test(comm, all_gather_fills_every_slice)
{
    cases cs = {gather_cases, sizeof gather_cases / sizeof gather_cases[0]};
    unsigned char *want = malloc(OUT_BYTES);
    for (int world = 1; world <= MAX_RANKS; world++) {
        group g;
        group_init(&g, world, 20000, SMALL_SLOT);
        int codes[MAX_RANKS];
        unsigned all = (1u << world) - 1;
        group_run(&g, all, gather_rank, &cs, codes);
        expect_all_ok(&g, all, codes);
        size_t at = 0;
        for (int k = 0; k < cs.n; k++) {
            size_t slice = cs.c[k].count * vlmd_dtype_size(cs.c[k].dtype);
            for (int q = 0; q < world; q++)
                fill(want + (size_t)q * slice, cs.c[k].dtype, k, q, cs.c[k].count);
            for (int r = 0; r < world; r++)
                cr_expect_arr_eq(g.sh->out[r] + at, want, slice * (size_t)world,
                                 "world %d rank %d, %s x %zu per rank: a slice differs", world,
                                 r, vlmd_dtype_str(cs.c[k].dtype), cs.c[k].count);
            at += slice * (size_t)world;
        }
        group_end(&g);
    }
    free(want);
}

/* ------------------------------------------------------------- broadcast */

static const size_t bcast_bytes[] = {1, 13, 0, 5000, 512, 40001};

/* For each size, from rank 0 and then from the last rank. */
static int bcast_rank(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg)
{
    (void)arg;
    size_t at = 0;
    for (size_t k = 0; k < sizeof bcast_bytes / sizeof bcast_bytes[0]; k++) {
        for (int pass = 0; pass < 2; pass++) {
            int root = pass ? g->world - 1 : 0;
            size_t bytes = bcast_bytes[k];
            unsigned char *host = g->sh->out[rank] + at;
            if (rank == root)
                fill(host, VLMD_DTYPE_BF16, (int)k, 100 + pass, bytes / 2);
            if (rank == root && bytes % 2)
                host[bytes - 1] = (unsigned char)(k + 1);
            if (rank != root)
                memset(host, 0xcd, bytes);
            void *dev = to_device(b, host, bytes);
            vlmd_error err = {0};
            if (vlmd_comm_broadcast(c, dev, bytes, root, &err) != VLMD_OK)
                return fail_rank(g, rank, "broadcast", &err);
            vlmd_backend_copy_to_host(b, host, dev, bytes, NULL);
            vlmd_backend_free(b, dev, bytes ? bytes : 1);
            at += bytes;
        }
    }
    return 0;
}

Test(comm, broadcast_copies_the_roots_bytes)
{
    for (int world = 1; world <= MAX_RANKS; world++) {
        group g;
        group_init(&g, world, 20000, SMALL_SLOT);
        int codes[MAX_RANKS];
        unsigned all = (1u << world) - 1;
        group_run(&g, all, bcast_rank, NULL, codes);
        expect_all_ok(&g, all, codes);
        size_t at = 0;
        for (size_t k = 0; k < sizeof bcast_bytes / sizeof bcast_bytes[0]; k++)
            for (int pass = 0; pass < 2; pass++) {
                size_t bytes = bcast_bytes[k];
                unsigned char *want = malloc(bytes + 1);
                fill(want, VLMD_DTYPE_BF16, (int)k, 100 + pass, bytes / 2);
                if (bytes % 2)
                    want[bytes - 1] = (unsigned char)(k + 1);
                for (int r = 0; r < world; r++)
                    cr_expect_arr_eq(g.sh->out[r] + at, want, bytes, "world %d rank %d: %zu "
                                     "bytes from rank %d differ", world, r, bytes,
                                     pass ? world - 1 : 0);
                free(want);
                at += bytes;
            }
        group_end(&g);
    }
}

/* --------------------------------------------------------------- barrier */

/* Ranks arrive late by turns; none may leave a barrier before all arrived. */
static int barrier_rank(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg)
{
    (void)b, (void)arg;
    for (unsigned round = 1; round <= 20; round++) {
        if ((int)(round % (unsigned)g->world) == rank) {
            struct timespec ts = {0, 3000000};
            nanosleep(&ts, NULL);
        }
        __atomic_fetch_add(&g->sh->counter, 1, __ATOMIC_SEQ_CST);
        vlmd_error err = {0};
        if (vlmd_comm_barrier(c, &err) != VLMD_OK)
            return fail_rank(g, rank, "barrier", &err);
        unsigned seen = __atomic_load_n(&g->sh->counter, __ATOMIC_SEQ_CST);
        if (seen < round * (unsigned)g->world) {
            snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "left barrier %u having seen "
                     "%u arrivals of %u", round, seen, round * (unsigned)g->world);
            return 2;
        }
        if (vlmd_comm_barrier(c, &err) != VLMD_OK) /* nobody counts the next round yet */
            return fail_rank(g, rank, "barrier", &err);
    }
    return 0;
}

Test(comm, barrier_waits_for_every_rank)
{
    for (int world = 1; world <= MAX_RANKS; world++) {
        group g;
        group_init(&g, world, 20000, SMALL_SLOT);
        int codes[MAX_RANKS];
        unsigned all = (1u << world) - 1;
        group_run(&g, all, barrier_rank, NULL, codes);
        expect_all_ok(&g, all, codes);
        group_end(&g);
    }
}

/* -------------------------------------------------------------- failures */

Test(comm, a_rank_that_never_joins_is_named_within_the_timeout)
{
    group g;
    group_init(&g, 3, 300, SMALL_SLOT);
    int codes[MAX_RANKS];
    group_run(&g, 0x3, NULL, NULL, codes); /* ranks 0 and 1; rank 2 never comes */
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(codes[r], 10, "rank %d: exit %d (%s)", r, codes[r], g.sh->msg[r]);
        cr_expect(strstr(g.sh->msg[r], "rank 2 did not join") != NULL, "rank %d: %s", r,
                  g.sh->msg[r]);
        /* the first to time out says so; the other may learn it from the first */
        cr_expect(g.sh->status[r] == VLMD_ERR_TIMEOUT || g.sh->status[r] == VLMD_ERR_UNAVAILABLE,
                  "rank %d: %s", r, g.sh->msg[r]);
        char self[64];
        snprintf(self, sizeof self, "communicator rank %d of 3, joining", r);
        cr_expect(strstr(g.sh->msg[r], self) != NULL, "names the rank that failed: %s",
                  g.sh->msg[r]);
        cr_expect_lt(g.sh->elapsed_ms[r], 300 + 2000, "rank %d failed after %lld ms", r,
                     (long long)g.sh->elapsed_ms[r]);
    }
    group_end(&g); /* rank 0 removed its file */
}

Test(comm, a_missing_rank_0_is_named)
{
    group g;
    group_init(&g, 2, 200, SMALL_SLOT);
    int codes[MAX_RANKS];
    group_run(&g, 0x2, NULL, NULL, codes);
    cr_expect_eq(g.sh->status[1], VLMD_ERR_TIMEOUT, "%s", g.sh->msg[1]);
    cr_expect(strstr(g.sh->msg[1], "rank 0 did not create") != NULL, "%s", g.sh->msg[1]);
    group_end(&g);
}

/* Rank `victim` (given) dies without leaving; the others' all-reduce fails
 * naming it, and every later operation fails at once. */
static int die_rank(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg)
{
    int victim = *(const int *)arg;
    if (rank == victim)
        _exit(0);
    float x[64];
    fill(x, VLMD_DTYPE_F32, 0, rank, 64);
    void *dev = to_device(b, x, sizeof x);
    vlmd_error err = {0};
    int64_t t0 = test_now_ms();
    vlmd_status st = vlmd_comm_all_reduce_sum(c, dev, 64, VLMD_DTYPE_F32, &err);
    g->sh->status[rank] = st;
    g->sh->elapsed_ms[rank] = test_now_ms() - t0;
    snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "%s", err.msg);
    vlmd_error again = {0};
    if (vlmd_comm_barrier(c, &again) == VLMD_OK || !strstr(again.msg, "broken")) {
        snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "after a failure: '%s'", again.msg);
        return 3;
    }
    return 0;
}

Test(comm, a_rank_that_dies_is_named_and_breaks_the_group)
{
    group g;
    group_init(&g, 3, 400, SMALL_SLOT);
    int victim = 1, codes[MAX_RANKS];
    group_run(&g, 0x7, die_rank, &victim, codes);
    for (int r = 0; r < 3; r += 2) {
        cr_expect_eq(codes[r], 0, "rank %d: %s", r, g.sh->msg[r]);
        /* the first to time out says so; the other may learn it from the first */
        cr_expect(g.sh->status[r] == VLMD_ERR_TIMEOUT || g.sh->status[r] == VLMD_ERR_UNAVAILABLE,
                  "rank %d: %s", r, g.sh->msg[r]);
        cr_expect(strstr(g.sh->msg[r], "rank 1 did not arrive") != NULL, "rank %d: %s", r,
                  g.sh->msg[r]);
        cr_expect(strstr(g.sh->msg[r], "all_reduce_sum") != NULL, "names the op: %s",
                  g.sh->msg[r]);
        cr_expect_lt(g.sh->elapsed_ms[r], 400 + 2000, "rank %d failed after %lld ms", r,
                     (long long)g.sh->elapsed_ms[r]);
    }
    group_end(&g);
}

/* A rank whose process is gone (rank 0 here: the parent reaps it first, so it
 * is no zombie) fails the others at once, long before the timeout, naming it. */
Test(comm, a_rank_whose_process_is_gone_fails_the_others_at_once)
{
    group g;
    group_init(&g, 3, 10000, SMALL_SLOT);
    int victim = 0, codes[MAX_RANKS], saw_it = 0;
    group_run(&g, 0x7, die_rank, &victim, codes);
    for (int r = 1; r < 3; r++) {
        cr_expect_eq(codes[r], 0, "rank %d: %s", r, g.sh->msg[r]);
        /* the first to see it says so; the other may learn it from the first */
        cr_expect_eq(g.sh->status[r], VLMD_ERR_UNAVAILABLE, "rank %d: %s", r, g.sh->msg[r]);
        cr_expect(strstr(g.sh->msg[r], "rank 0"), "rank %d: %s", r, g.sh->msg[r]);
        saw_it += strstr(g.sh->msg[r], "rank 0 (pid ") && strstr(g.sh->msg[r], "is gone");
        cr_expect_lt(g.sh->elapsed_ms[r], 5000, "rank %d failed after %lld ms, not at once", r,
                     (long long)g.sh->elapsed_ms[r]);
    }
    cr_expect_geq(saw_it, 1, "a rank named the process that is gone");
    group_end(&g);
}

/* A rank that leaves (destroys its communicator) fails the others at once. */
static int leave_rank(group *g, vlmd_backend *b, vlmd_comm *c, int rank, const void *arg)
{
    (void)b, (void)arg;
    if (rank == 0)
        return 0; /* rank_main destroys it */
    vlmd_error err = {0};
    int64_t t0 = test_now_ms();
    g->sh->status[rank] = vlmd_comm_barrier(c, &err);
    g->sh->elapsed_ms[rank] = test_now_ms() - t0;
    snprintf(g->sh->msg[rank], sizeof g->sh->msg[rank], "%s", err.msg);
    return 0;
}

Test(comm, a_rank_that_leaves_fails_the_others_before_the_timeout)
{
    group g;
    group_init(&g, 2, 10000, SMALL_SLOT);
    int codes[MAX_RANKS];
    group_run(&g, 0x3, leave_rank, NULL, codes);
    expect_all_ok(&g, 0x3, codes);
    cr_expect_eq(g.sh->status[1], VLMD_ERR_UNAVAILABLE, "%s", g.sh->msg[1]);
    cr_expect(strstr(g.sh->msg[1], "rank 0 left the group") != NULL, "%s", g.sh->msg[1]);
    cr_expect_lt(g.sh->elapsed_ms[1], 5000, "failed after %lld ms, not at once",
                 (long long)g.sh->elapsed_ms[1]);
    group_end(&g);
}

/* --------------------------------------------------- ids and arguments */

Test(comm, an_id_travels_as_bytes)
{
    vlmd_comm_id id, back;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_comm_id_make(VLMD_DEVICE_CPU, "/dev/shm", &id, &err), VLMD_OK, "%s",
                 err.msg);
    size_t len = 0;
    const void *bytes = vlmd_comm_id_bytes(&id, &len);
    cr_expect_lt(len, sizeof id, "only the bytes used are sent");
    cr_assert_eq(vlmd_comm_id_from_bytes(bytes, len, &back, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(memcmp(&id, &back, sizeof id), 0);
    cr_expect_eq(vlmd_comm_id_from_bytes(bytes, len - 1, &back, &err), VLMD_ERR_PROTO);
    cr_expect_eq(vlmd_comm_id_from_bytes(bytes, 3, &back, &err), VLMD_ERR_PROTO);
    cr_expect_eq(vlmd_comm_id_make(VLMD_DEVICE_CPU, "", &id, &err), VLMD_ERR_INVALID_ARG);
    vlmd_comm_id other;
    cr_assert_eq(vlmd_comm_id_make(VLMD_DEVICE_CPU, "/dev/shm", &other, &err), VLMD_OK);
    cr_expect_neq(strcmp((char *)id.data, (char *)other.data), 0, "each id is a new file");
}

Test(comm, arguments_are_checked)
{
    group g;
    group_init(&g, 1, 2000, SMALL_SLOT);
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    vlmd_comm *c = NULL;
    vlmd_comm_options o = {.rank = 1, .world = 1};
    cr_expect_eq(vlmd_comm_create(b, &g.id, &o, &c, &err), VLMD_ERR_INVALID_ARG);
    o.rank = 0;
    cr_assert_eq(vlmd_comm_create(b, &g.id, &o, &c, &err), VLMD_OK, "%s", err.msg);
    float x[4] = {1, 2, 3, 4};
    cr_expect_eq(vlmd_comm_all_reduce_sum(c, x, 4, VLMD_DTYPE_F16, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "rank 0 of 1, all_reduce_sum") != NULL, "%s", err.msg);
    cr_expect_eq(vlmd_comm_broadcast(c, x, 16, 1, &err), VLMD_ERR_INVALID_ARG);
    cr_expect_eq(vlmd_comm_all_reduce_sum(c, x, 4, VLMD_DTYPE_F32, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(x[3], 4.0f, "one rank's sum is its own");
    cr_expect_eq(vlmd_comm_rank(c), 0);
    cr_expect_eq(vlmd_comm_world(c), 1);
    vlmd_comm_destroy(c);
    vlmd_comm_destroy(NULL);
    /* a CUDA id for a CPU backend */
    vlmd_comm_id cuda_id = {.kind = VLMD_DEVICE_CUDA, .len = 4};
    cr_expect_eq(vlmd_comm_create(b, &cuda_id, &o, &c, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "a cuda id for a cpu backend") != NULL, "%s", err.msg);
    vlmd_backend_destroy(b);
    group_end(&g);
}

/* ----------------------------------------------------------------- NCCL */

Test(comm, nccl_refuses_clearly_without_a_gpu_or_runs_one_rank)
{
    vlmd_comm_id id;
    vlmd_error err = {0};
    vlmd_status st = vlmd_comm_id_make(VLMD_DEVICE_CUDA, NULL, &id, &err);
    if (st != VLMD_OK) {
        cr_expect_eq(st, VLMD_ERR_UNAVAILABLE, "%s", err.msg);
        cr_expect(strstr(err.msg, "NCCL") != NULL, "the refusal names NCCL: %s", err.msg);
        cr_log_info("NCCL: %s", err.msg);
        return;
    }
    /* a GPU and NCCL: one rank, every operation */
    vlmd_backend *b = NULL;
    cr_assert_eq(vlmd_backend_create("cuda", &b, &err), VLMD_OK, "%s", err.msg);
    vlmd_comm *c = NULL;
    vlmd_comm_options o = {.rank = 0, .world = 1, .timeout_ms = 20000};
    cr_assert_eq(vlmd_comm_create(b, &id, &o, &c, &err), VLMD_OK, "%s", err.msg);
    size_t n = 4099;
    uint16_t *host = malloc(n * 2), *back = malloc(n * 2);
    fill(host, VLMD_DTYPE_BF16, 1, 0, n);
    void *dev = NULL;
    cr_assert_eq(vlmd_backend_alloc(b, n * 2, &dev, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_copy_to_device(b, dev, host, n * 2, &err), VLMD_OK);
    cr_expect_eq(vlmd_comm_all_reduce_sum(c, dev, n, VLMD_DTYPE_BF16, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(vlmd_comm_all_gather(c, dev, n, VLMD_DTYPE_BF16, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_comm_broadcast(c, dev, n * 2, 0, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_comm_barrier(c, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_copy_to_host(b, back, dev, n * 2, &err), VLMD_OK);
    cr_expect_arr_eq(back, host, n * 2, "one rank's collectives leave its data as it was");
    vlmd_backend_free(b, dev, n * 2);
    free(host);
    free(back);
    vlmd_comm_destroy(c);
    vlmd_backend_destroy(b);
}
