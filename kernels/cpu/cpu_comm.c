/* cpu_comm.c - the CPU communicator (comm.h): N processes of one host, each
 * mapping one shared file (in the runtime directory) that holds a barrier and
 * one slot of data per rank.
 *
 * The file, fixed in size when rank 0 creates it (never grown):
 *
 *   [0, 256)            cpu_comm_header: magic, version, world, slot bytes,
 *                       file bytes; the barrier (count, generation, waiters)
 *                       and abort_by, each on a cache line of its own
 *   [256, 256 + 64 N)   cpu_comm_rank per rank: its pid once joined, the
 *                       barrier it last arrived at, whether it left
 *   [data, + N slot)    rank r's slot at data + r * slot; each slot is two
 *                       halves, used by turns (round k takes half k % 2)
 *
 * Rank 0 builds the file under a temporary name and links it to the id's
 * path when it is complete, so a joining rank sees no file or a whole one.
 * Once every rank has joined (mapped it and met at the join barrier) rank 0
 * unlinks it: after that nothing is left on disk whatever happens to the
 * ranks (before, rank 0 unlinks it on a failed join; a crash of rank 0 in
 * that window leaves it in the runtime directory).
 *
 * The barrier is sense-reversing: each rank notes its arrival, the last of
 * the N to arrive resets the count and bumps the generation, the others
 * spin briefly and then sleep on the generation (a futex shared between the
 * processes, 10 ms at a time), bounded by the timeout. A rank that gives up
 * sets abort_by and a rank that leaves sets its `left`, so that the others
 * fail at once instead of at their own timeouts.
 *
 * Each operation moves its data in rounds of at most half a slot per rank.
 * A round's first step writes this rank's half and its last reads others';
 * every round has a barrier between the two, so the round after next (the
 * same half again) writes only once every rank has finished reading it.
 * All-reduce is a reduce-scatter and an all-gather over the slots: after the
 * first barrier rank r sums the r-th part of every rank's chunk in fp32, in
 * rank order, and writes it into its own slot; after the second every rank
 * copies each part. Every rank thus gets the same bits: the single-process
 * sum in rank order (bf16 rounded once). */
#include "comm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"

#define CPU_COMM_MAGIC 0x6d6d6f63646d6c76ull   /* "vlmdcomm" */
#define CPU_COMM_VERSION 1
#define CPU_COMM_HEADER_BYTES 256
#define CPU_COMM_SPINS 256                      /* polls before sleeping */
#define CPU_COMM_SLEEP_NS 10000000L             /* one futex sleep at most: 10 ms */
#define CPU_COMM_MIN_SLOT 256
#define CPU_COMM_MAX_WORLD 64                   /* abort_missing's bits */

typedef struct cpu_comm_header {
    uint64_t magic;
    uint32_t version, world;
    uint64_t slot_bytes;                /* each rank's slot (two halves) */
    uint64_t file_bytes;
    char pad0[32];
    _Atomic uint32_t count;             /* ranks arrived at the current barrier */
    char pad1[60];
    _Atomic uint32_t gen;               /* barriers completed (the futex word) */
    _Atomic uint32_t waiters;           /* ranks asleep on gen */
    _Atomic uint32_t abort_by;          /* rank + 1 of the first rank that gave up; 0: none */
    uint32_t pad2;
    _Atomic uint64_t abort_missing;     /* the ranks it waited for in vain (bit r: rank r) */
    char pad3[40];
} cpu_comm_header;
_Static_assert(sizeof(cpu_comm_header) <= CPU_COMM_HEADER_BYTES, "header fits its bytes");

typedef struct cpu_comm_rank {
    _Atomic int32_t pid;                /* 0 until the rank joins */
    _Atomic uint32_t arrived;           /* gen + 1 of the barrier it last arrived at */
    _Atomic uint32_t left;              /* 1 once it has left the group */
    char pad[52];
} cpu_comm_rank;
_Static_assert(sizeof(cpu_comm_rank) == 64, "one cache line per rank");

typedef struct cpu_comm {
    char path[VLMD_COMM_ID_MAX];
    unsigned char *map;                 /* the whole file, mapped shared */
    size_t map_bytes;
    cpu_comm_header *h;
    cpu_comm_rank *ranks;               /* [world] */
    unsigned char *slots;               /* [world][slot_bytes] */
    size_t slot_bytes, half_bytes;
    uint64_t round;                     /* rounds done: the same on every rank */
    float *acc;                         /* the reduction's sums, half_bytes / 2 floats */
    bool unlinked;                      /* rank 0: the file's name is gone */
} cpu_comm;

static cpu_comm *cc_of(vlmd_comm *c)
{
    return (cpu_comm *)c->impl;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t deadline_of(const vlmd_comm *c)
{
    return now_ns() + (int64_t)c->timeout_ms * 1000000;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Sleeps while *word == val, for at most ns (a shared futex: the word is in
 * the mapped file). Spurious returns are fine: the callers loop. */
static void futex_sleep(_Atomic uint32_t *word, uint32_t val, int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static size_t layout_data_offset(int world)
{
    size_t end = CPU_COMM_HEADER_BYTES + (size_t)world * sizeof(cpu_comm_rank);
    return (end + 4095) & ~(size_t)4095;
}

/* ================================================================ barrier */

/* The ranks that have not arrived at barrier g (bit r: rank r). */
static uint64_t missing_ranks(const vlmd_comm *c, uint32_t g)
{
    cpu_comm *cc = (cpu_comm *)c->impl;
    uint64_t missing = 0;
    for (int q = 0; q < c->world; q++)
        if (atomic_load(&cc->ranks[q].arrived) != g + 1)
            missing |= 1ull << q;
    return missing;
}

/* "1, 3" of a set of ranks. */
static const char *rank_list(uint64_t ranks, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (int q = 0; q < CPU_COMM_MAX_WORLD && at < cap; q++)
        if (ranks >> q & 1)
            at += (size_t)snprintf(out + at, cap - at, "%s%d", at ? ", " : "", q);
    return out;
}

/* Tells the other ranks that this one gave up (waiting for `missing`), so
 * that they fail now, naming them too. */
static void give_up(vlmd_comm *c, uint64_t missing)
{
    cpu_comm *cc = cc_of(c);
    uint32_t none = 0;
    atomic_fetch_or(&cc->h->abort_missing, missing); /* before abort_by: read after it */
    atomic_compare_exchange_strong(&cc->h->abort_by, &none, (uint32_t)c->rank + 1);
    futex_wake_all(&cc->h->gen);
}

/* A rank that joined and has not arrived at barrier g whose process is gone
 * (killed, crashed: it could not say it left), or -1. Ranks share a host, so
 * its pid is checked; a zombie not yet reaped still counts as there. */
static int dead_rank(const vlmd_comm *c, uint32_t g, int32_t *pid)
{
    cpu_comm *cc = (cpu_comm *)c->impl;
    for (int q = 0; q < c->world; q++) {
        *pid = atomic_load(&cc->ranks[q].pid);
        if (q != c->rank && *pid > 0 && atomic_load(&cc->ranks[q].arrived) != g + 1 &&
            kill(*pid, 0) != 0 && errno == ESRCH)
            return q;
    }
    return -1;
}

/* Meets every rank (`what` names the wait in errors: "join" or "barrier"),
 * bounded by `deadline`. On a failure this rank gives up, and the error
 * names the ranks that did not arrive, the one that gave up first, or the
 * one that left. */
static vlmd_status barrier_until(vlmd_comm *c, int64_t deadline, const char *what,
                                 vlmd_error *err)
{
    cpu_comm *cc = cc_of(c);
    cpu_comm_header *h = cc->h;
    uint32_t g = atomic_load(&h->gen); /* cannot move on before this rank arrives */
    atomic_store(&cc->ranks[c->rank].arrived, g + 1);
    if (atomic_fetch_add(&h->count, 1) == (uint32_t)c->world - 1) {
        atomic_store(&h->count, 0);
        atomic_store(&h->gen, g + 1);
        if (atomic_load(&h->waiters))
            futex_wake_all(&h->gen);
        return VLMD_OK;
    }
    for (int spin = 0; spin < CPU_COMM_SPINS; spin++) {
        if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
            return VLMD_OK;
        cpu_relax();
    }
    for (;;) {
        if (atomic_load(&h->gen) != g)
            return VLMD_OK;
        uint32_t by = atomic_load(&h->abort_by);
        if (by) {
            char missing[256];
            uint64_t set = atomic_load(&h->abort_missing) & ~(1ull << c->rank);
            if (!set)
                return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "%s: rank %u gave up (it "
                                   "failed); the group must restart", what, by - 1);
            return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "%s: rank %u gave up waiting: rank "
                               "%s did not %s", what, by - 1,
                               rank_list(set, missing, sizeof missing),
                               strcmp(what, "join") == 0 ? "join" : "arrive");
        }
        for (int q = 0; q < c->world; q++)
            if (atomic_load(&cc->ranks[q].left) && atomic_load(&cc->ranks[q].arrived) != g + 1)
                return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "%s: rank %d left the group",
                                   what, q);
        int32_t pid;
        int dead = dead_rank(c, g, &pid);
        if (dead >= 0) { /* fail now, not at the timeout */
            give_up(c, 1ull << dead);
            return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "%s: rank %d (pid %d) is gone; the "
                               "group must restart", what, dead, (int)pid);
        }
        int64_t left = deadline - now_ns();
        if (left <= 0) {
            char missing[256];
            uint64_t set = missing_ranks(c, g);
            give_up(c, set);
            return vlmd_errorf(err, VLMD_ERR_TIMEOUT, "%s: rank %s did not %s within %d ms", what,
                               rank_list(set, missing, sizeof missing),
                               strcmp(what, "join") == 0 ? "join" : "arrive", c->timeout_ms);
        }
        atomic_fetch_add(&h->waiters, 1);
        if (atomic_load(&h->gen) == g)
            futex_sleep(&h->gen, g, left < CPU_COMM_SLEEP_NS ? left : CPU_COMM_SLEEP_NS);
        atomic_fetch_sub(&h->waiters, 1);
    }
}

static vlmd_status barrier(vlmd_comm *c, vlmd_error *err)
{
    return barrier_until(c, deadline_of(c), "barrier", err);
}

/* ============================================================= operations */

static unsigned char *slot_half(cpu_comm *cc, int r, uint64_t round)
{
    return cc->slots + (size_t)r * cc->slot_bytes + (size_t)(round & 1) * cc->half_bytes;
}

static vlmd_status all_reduce_sum(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                  vlmd_error *err)
{
    cpu_comm *cc = cc_of(c);
    size_t es = vlmd_dtype_size(dtype), per = cc->half_bytes / es;
    unsigned char *data = buf;
    vlmd_status st = VLMD_OK;
    for (size_t at = 0; st == VLMD_OK && at < count; at += per) {
        size_t n = count - at < per ? count - at : per;
        uint64_t round = cc->round++;
        memcpy(slot_half(cc, c->rank, round), data + at * es, n * es);
        if ((st = barrier(c, err)) != VLMD_OK)
            break;
        /* reduce-scatter: this rank's part of every slot, summed in rank order */
        size_t lo = n * (size_t)c->rank / (size_t)c->world;
        size_t hi = n * (size_t)(c->rank + 1) / (size_t)c->world;
        float *acc = cc->acc;
        for (int q = 0; q < c->world; q++) {
            const unsigned char *src = slot_half(cc, q, round);
            if (dtype == VLMD_DTYPE_F32) {
                const float *s = (const float *)src;
                if (q == 0)
                    memcpy(acc, s + lo, (hi - lo) * sizeof *acc);
                else
                    for (size_t i = lo; i < hi; i++)
                        acc[i - lo] += s[i];
            } else {
                const uint16_t *s = (const uint16_t *)src;
                for (size_t i = lo; i < hi; i++) {
                    float v = vlmd_cpu_load(s, VLMD_DTYPE_BF16, i);
                    acc[i - lo] = q == 0 ? v : acc[i - lo] + v;
                }
            }
        }
        unsigned char *mine = slot_half(cc, c->rank, round);
        if (dtype == VLMD_DTYPE_F32)
            memcpy((float *)mine + lo, acc, (hi - lo) * sizeof *acc);
        else
            for (size_t i = lo; i < hi; i++)
                ((uint16_t *)mine)[i] = vlmd_cpu_to_bf16(acc[i - lo]);
        if ((st = barrier(c, err)) != VLMD_OK)
            break;
        /* all-gather: every rank's summed part */
        for (int q = 0; q < c->world; q++) {
            size_t qlo = n * (size_t)q / (size_t)c->world;
            size_t qhi = n * (size_t)(q + 1) / (size_t)c->world;
            memcpy(data + (at + qlo) * es, slot_half(cc, q, round) + qlo * es, (qhi - qlo) * es);
        }
    }
    return st;
}

static vlmd_status all_gather(vlmd_comm *c, void *buf, size_t bytes, vlmd_error *err)
{
    cpu_comm *cc = cc_of(c);
    unsigned char *data = buf;
    vlmd_status st = VLMD_OK;
    for (size_t at = 0; st == VLMD_OK && at < bytes; at += cc->half_bytes) {
        size_t n = bytes - at < cc->half_bytes ? bytes - at : cc->half_bytes;
        uint64_t round = cc->round++;
        memcpy(slot_half(cc, c->rank, round), data + (size_t)c->rank * bytes + at, n);
        if ((st = barrier(c, err)) != VLMD_OK)
            break;
        for (int q = 0; q < c->world; q++)
            if (q != c->rank)
                memcpy(data + (size_t)q * bytes + at, slot_half(cc, q, round), n);
    }
    return st;
}

static vlmd_status broadcast(vlmd_comm *c, void *buf, size_t bytes, int root, vlmd_error *err)
{
    cpu_comm *cc = cc_of(c);
    unsigned char *data = buf;
    vlmd_status st = VLMD_OK;
    for (size_t at = 0; st == VLMD_OK && at < bytes; at += cc->half_bytes) {
        size_t n = bytes - at < cc->half_bytes ? bytes - at : cc->half_bytes;
        uint64_t round = cc->round++;
        if (c->rank == root)
            memcpy(slot_half(cc, root, round), data + at, n);
        if ((st = barrier(c, err)) != VLMD_OK)
            break;
        if (c->rank != root)
            memcpy(data + at, slot_half(cc, root, round), n);
    }
    return st;
}

/* ============================================================ join, leave */

static void cpu_comm_free(cpu_comm *cc, bool rank0)
{
    if (rank0 && !cc->unlinked)
        unlink(cc->path);
    if (cc->map)
        munmap(cc->map, cc->map_bytes);
    free(cc->acc);
    free(cc);
}

static void destroy(vlmd_comm *c)
{
    cpu_comm *cc = cc_of(c);
    atomic_store(&cc->ranks[c->rank].left, 1);
    futex_wake_all(&cc->h->gen);
    cpu_comm_free(cc, c->rank == 0);
}

static const vlmd_comm_vtable cpu_comm_ops = {
    .all_reduce_sum = all_reduce_sum,
    .all_gather = all_gather,
    .broadcast = broadcast,
    .barrier = barrier,
    .destroy = destroy,
};

vlmd_status vlmd_cpu_comm_id_make(const char *dir, vlmd_comm_id *id, vlmd_error *err)
{
    static _Atomic unsigned serial;
    if (!dir || !dir[0])
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator: the CPU's needs a directory "
                           "(the runtime directory) for its shared file");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf((char *)id->data, sizeof id->data, "%s/comm-%ld-%u-%lx.shm", dir,
                     (long)getpid(), atomic_fetch_add(&serial, 1), (unsigned long)ts.tv_nsec);
    if (n < 0 || (size_t)n >= sizeof id->data)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator: the directory %s is too "
                           "long for a shared file's path", dir);
    id->len = (uint32_t)n + 1;
    return VLMD_OK;
}

/* Rank 0: the file, whole, at its path (created under a temporary name and
 * linked, so a joining rank never maps a file half made). */
static vlmd_status create_file(vlmd_comm *c, cpu_comm *cc, size_t slot_bytes, vlmd_error *err)
{
    size_t data = layout_data_offset(c->world);
    if (slot_bytes > (SIZE_MAX - data) / (size_t)c->world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "slots of %zu bytes", slot_bytes);
    cc->map_bytes = data + (size_t)c->world * slot_bytes;
    char tmp[VLMD_COMM_ID_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.new", cc->path);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    vlmd_status st = VLMD_OK;
    if (ftruncate(fd, (off_t)cc->map_bytes) != 0) {
        st = vlmd_errorf(err, VLMD_ERR_IO, "cannot size %s to %zu bytes: %s", tmp,
                         cc->map_bytes, strerror(errno));
        goto fail;
    }
    cc->map = mmap(NULL, cc->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (cc->map == MAP_FAILED) {
        cc->map = NULL;
        st = vlmd_errorf(err, VLMD_ERR_IO, "cannot map %s: %s", tmp, strerror(errno));
        goto fail;
    }
    cpu_comm_header *h = (cpu_comm_header *)cc->map; /* the file starts zeroed */
    h->version = CPU_COMM_VERSION;
    h->world = (uint32_t)c->world;
    h->slot_bytes = slot_bytes;
    h->file_bytes = cc->map_bytes;
    atomic_store((_Atomic uint64_t *)&h->magic, CPU_COMM_MAGIC);
    if (link(tmp, cc->path) != 0)
        st = vlmd_errorf(err, VLMD_ERR_IO, "cannot create %s: %s", cc->path, strerror(errno));
fail:
    unlink(tmp);
    close(fd);
    return st;
}

/* The other ranks: the file rank 0 made, once it is there (bounded). */
static vlmd_status open_file(vlmd_comm *c, cpu_comm *cc, int64_t deadline, vlmd_error *err)
{
    int fd;
    for (int64_t nap = 100000; (fd = open(cc->path, O_RDWR | O_CLOEXEC)) < 0; nap *= 2) {
        if (errno != ENOENT)
            return vlmd_errorf(err, VLMD_ERR_IO, "cannot open %s: %s", cc->path,
                               strerror(errno));
        int64_t left = deadline - now_ns();
        if (left <= 0)
            return vlmd_errorf(err, VLMD_ERR_TIMEOUT, "rank 0 did not create %s within %d ms",
                               cc->path, c->timeout_ms);
        nap = nap < CPU_COMM_SLEEP_NS ? nap : CPU_COMM_SLEEP_NS;
        struct timespec ts = {0, (long)(nap < left ? nap : left)};
        nanosleep(&ts, NULL);
    }
    vlmd_status st = VLMD_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < layout_data_offset(c->world)) {
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s is not a communicator's file of %d "
                         "ranks", cc->path, c->world);
        goto done;
    }
    cc->map_bytes = (size_t)sb.st_size;
    cc->map = mmap(NULL, cc->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (cc->map == MAP_FAILED) {
        cc->map = NULL;
        st = vlmd_errorf(err, VLMD_ERR_IO, "cannot map %s: %s", cc->path, strerror(errno));
        goto done;
    }
    const cpu_comm_header *h = (const cpu_comm_header *)cc->map;
    if (atomic_load((_Atomic uint64_t *)&h->magic) != CPU_COMM_MAGIC ||
        h->version != CPU_COMM_VERSION || h->file_bytes != cc->map_bytes)
        st = vlmd_errorf(err, VLMD_ERR_VERSION, "%s is not a version-%d communicator's file",
                         cc->path, CPU_COMM_VERSION);
    else if (h->world != (uint32_t)c->world)
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "rank 0 made a group of %u ranks, not %d",
                         h->world, c->world);
    else if (h->slot_bytes < CPU_COMM_MIN_SLOT ||
             layout_data_offset(c->world) + (size_t)c->world * h->slot_bytes != cc->map_bytes)
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: slots of %llu bytes do not fit its "
                         "%zu", cc->path, (unsigned long long)h->slot_bytes, cc->map_bytes);
done:
    close(fd);
    return st;
}

vlmd_status vlmd_cpu_comm_open(vlmd_comm *c, const vlmd_comm_id *id, size_t slot_bytes,
                               vlmd_error *err)
{
    int64_t deadline = deadline_of(c);
    if (id->len < 2 || id->len > sizeof id->data || id->data[id->len - 1] != '\0')
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "not a CPU communicator's id");
    if (c->world > CPU_COMM_MAX_WORLD)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%d ranks: the CPU's takes %d at most",
                           c->world, CPU_COMM_MAX_WORLD);
    cpu_comm *cc = calloc(1, sizeof *cc);
    if (!cc)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    memcpy(cc->path, id->data, id->len);
    bool rank0 = c->rank == 0;
    slot_bytes = slot_bytes < CPU_COMM_MIN_SLOT ? CPU_COMM_MIN_SLOT : slot_bytes;
    slot_bytes = (slot_bytes + 127) & ~(size_t)127; /* halves on cache lines */
    vlmd_status st = rank0 ? create_file(c, cc, slot_bytes, err)
                           : open_file(c, cc, deadline, err);
    if (st != VLMD_OK) {
        cc->unlinked = true; /* a failed create_file leaves no name; others never own one */
        cpu_comm_free(cc, rank0);
        return st;
    }
    cc->h = (cpu_comm_header *)cc->map;
    cc->ranks = (cpu_comm_rank *)(cc->map + CPU_COMM_HEADER_BYTES);
    cc->slots = cc->map + layout_data_offset(c->world);
    cc->slot_bytes = cc->h->slot_bytes;
    cc->half_bytes = cc->slot_bytes / 2;
    cc->acc = malloc(cc->half_bytes / 2 * sizeof *cc->acc); /* the most bf16 a half holds */
    if (!cc->acc) {
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        goto fail;
    }
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&cc->ranks[c->rank].pid, &none, (int32_t)getpid())) {
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "rank %d already joined %s (pid %d)",
                         c->rank, cc->path, (int)none);
        goto fail;
    }
    c->ops = &cpu_comm_ops;
    c->impl = cc;
    if ((st = barrier_until(c, deadline, "join", err)) != VLMD_OK)
        goto fail;
    if (rank0) { /* every rank has it mapped: the name is no longer needed */
        unlink(cc->path);
        cc->unlinked = true;
    }
    return VLMD_OK;
fail:
    if (c->impl) {
        give_up(c, 0);
        c->impl = NULL;
    }
    cpu_comm_free(cc, rank0);
    return st;
}
