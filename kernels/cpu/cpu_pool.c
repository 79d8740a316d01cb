/* cpu_pool.c - the CPU backend's thread pool (see cpu_pool.h).
 *
 * A task is published by bumping a generation counter; each worker runs its
 * part and counts itself out, the last one out wakes the caller. Waiting is
 * a short spin (an op follows an op within microseconds during a step) and
 * then a condition variable, so an idle pool costs nothing and a loaded
 * machine is not spun on for long. The sleep paths use the store-then-load
 * pattern on seq_cst atomics on both sides (waiter: announce, re-check;
 * waker: publish, check for waiters), so no wake-up is lost.
 *
 * Each part is claimed before it runs (an exchange on its flag): the
 * caller, done with part 0, runs every part whose worker has not claimed it
 * yet, so on a loaded machine a worker that is not scheduled delays no op;
 * the caller then waits only for parts a worker claimed. A late worker finds
 * its part claimed and skips it (a flag is reset, after the task is
 * written, only when the next task is published).
 *
 * Owns its threads and their scratch; destroy joins them. */
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Spin iterations before sleeping: tens of microseconds. */
#define POOL_SPIN 4096

typedef struct pool_worker {
    vlmd_cpu_pool *p;
    int index;
} pool_worker;

struct vlmd_cpu_pool {
    int n;                          /* threads, the caller's included */
    pthread_t *threads;             /* n - 1 */
    int started;                    /* of them running */
    pool_worker *workers;
    void **scratch;                 /* n, VLMD_CPU_SCRATCH_BYTES each */
    pthread_mutex_t run_lock;       /* one task at a time */
    pthread_mutex_t lock;           /* the sleep paths */
    pthread_cond_t work_cond, done_cond;
    _Atomic unsigned gen;           /* bumped per task */
    _Atomic int pending;            /* parts 1..n-1 not yet run */
    _Atomic bool *claimed;          /* n: part i taken, by its worker or the caller */
    _Atomic int sleepers;           /* workers asleep on work_cond */
    _Atomic bool caller_waiting;    /* the caller asleep on done_cond */
    _Atomic bool stop;
    vlmd_cpu_task fn;               /* the task: written before gen is bumped */
    void *ctx;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
    pool_worker *w = arg;
    vlmd_cpu_pool *p = w->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load(&p->gen);
        for (int i = 0; g == seen && i < POOL_SPIN; i++) {
            cpu_relax();
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen)
                pthread_cond_wait(&p->work_cond, &p->lock);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->lock);
        }
        seen = g;
        if (atomic_load(&p->stop))
            return NULL;
        if (atomic_exchange(&p->claimed[w->index], true))
            continue; /* the caller ran it */
        p->fn(p->ctx, w->index, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_waiting)) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done_cond);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

/* Publishes the task in p->fn and p->ctx to every worker. */
static void wake_workers(vlmd_cpu_pool *p)
{
    atomic_store(&p->pending, p->n - 1);
    for (int i = 1; i < p->n; i++)
        atomic_store(&p->claimed[i], false);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->work_cond);
        pthread_mutex_unlock(&p->lock);
    }
}

static void wait_workers(vlmd_cpu_pool *p)
{
    for (int i = 1; i < p->n; i++) /* the parts no worker has started */
        if (!atomic_exchange(&p->claimed[i], true)) {
            p->fn(p->ctx, i, p->n);
            atomic_fetch_sub(&p->pending, 1);
        }
    for (int i = 0; atomic_load(&p->pending) && i < POOL_SPIN; i++)
        cpu_relax();
    if (!atomic_load(&p->pending))
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->caller_waiting, true);
    while (atomic_load(&p->pending))
        pthread_cond_wait(&p->done_cond, &p->lock);
    atomic_store(&p->caller_waiting, false);
    pthread_mutex_unlock(&p->lock);
}

int vlmd_cpu_pool_default_size(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

vlmd_status vlmd_cpu_pool_create(int n, vlmd_cpu_pool **out, vlmd_error *err)
{
    *out = NULL;
    VLMD_ASSERT(n >= 1);
    vlmd_cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the CPU thread pool");
    p->n = n;
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work_cond, NULL);
    pthread_cond_init(&p->done_cond, NULL);
    p->threads = calloc((size_t)n, sizeof *p->threads);
    p->workers = calloc((size_t)n, sizeof *p->workers);
    p->scratch = calloc((size_t)n, sizeof *p->scratch);
    p->claimed = calloc((size_t)n, sizeof *p->claimed);
    bool ok = p->threads && p->workers && p->scratch && p->claimed;
    for (int i = 0; ok && i < n; i++)
        ok = (p->scratch[i] = aligned_alloc(64, VLMD_CPU_SCRATCH_BYTES)) != NULL;
    if (!ok) {
        vlmd_cpu_pool_destroy(p);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for %d threads' scratch", n);
    }
    for (int i = 1; i < n; i++) {
        p->workers[i] = (pool_worker){p, i};
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i]) != 0) {
            vlmd_cpu_pool_destroy(p);
            return vlmd_errorf(err, VLMD_ERR_IO, "could not start CPU thread %d of %d", i, n);
        }
        p->started++;
    }
    *out = p;
    return VLMD_OK;
}

void vlmd_cpu_pool_destroy(vlmd_cpu_pool *p)
{
    if (!p)
        return;
    if (p->started) {
        atomic_store(&p->stop, true);
        atomic_fetch_add(&p->gen, 1);
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->work_cond);
        pthread_mutex_unlock(&p->lock);
        for (int i = 0; i < p->started; i++)
            pthread_join(p->threads[i], NULL);
    }
    for (int i = 0; p->scratch && i < p->n; i++)
        free(p->scratch[i]);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work_cond);
    pthread_cond_destroy(&p->done_cond);
    free(p->scratch);
    free((void *)p->claimed);
    free(p->threads);
    free(p->workers);
    free(p);
}

int vlmd_cpu_pool_size(const vlmd_cpu_pool *p)
{
    return p->n;
}

void vlmd_cpu_pool_run(vlmd_cpu_pool *p, vlmd_cpu_task fn, void *ctx, bool alone)
{
    pthread_mutex_lock(&p->run_lock);
    if (alone || p->n == 1) {
        fn(ctx, 0, 1);
        pthread_mutex_unlock(&p->run_lock);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    wake_workers(p);
    fn(ctx, 0, p->n);
    wait_workers(p);
    pthread_mutex_unlock(&p->run_lock);
}

void *vlmd_cpu_pool_scratch(vlmd_cpu_pool *p, int index)
{
    return p->scratch[index];
}

void vlmd_cpu_split(int total, int align, int index, int count, int *lo, int *hi)
{
    long units = ((long)total + align - 1) / align;
    long a = units * index / count * align, b = units * (index + 1) / count * align;
    *lo = (int)(a < total ? a : total);
    *hi = (int)(b < total ? b : total);
}
