/* cpu_pool.h - the CPU backend's threads: one small persistent pool that
 * runs a task on all of its threads at once and returns when every one is
 * done (a fork and a join per op).
 *
 * Defines vlmd_cpu_pool (create/destroy), vlmd_cpu_pool_run, the split of a
 * range among the threads and each thread's scratch. */
#ifndef VLMD_CPU_POOL_H
#define VLMD_CPU_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* Per-thread scratch: widened weight tiles and attention blocks live here,
 * so ops allocate nothing while they run. */
#define VLMD_CPU_SCRATCH_BYTES ((size_t)4 << 20)

typedef struct vlmd_cpu_pool vlmd_cpu_pool;

/* fn(ctx, index, count): the task's part `index` of `count` (one per thread). */
typedef void (*vlmd_cpu_task)(void *ctx, int index, int count);

/* A pool of n threads (the caller of run counts as one: n - 1 are started).
 * VLMD_ERR_NOMEM or VLMD_ERR_IO (a thread that could not start), nothing
 * left behind. */
vlmd_status vlmd_cpu_pool_create(int n, vlmd_cpu_pool **out, vlmd_error *err);
void vlmd_cpu_pool_destroy(vlmd_cpu_pool *p);      /* accepts NULL */
int vlmd_cpu_pool_size(const vlmd_cpu_pool *p);
/* The cores this process may run on (sched_getaffinity), at least 1. */
int vlmd_cpu_pool_default_size(void);

/* Runs fn(ctx, i, n) once for every i < n (n: the pool's size, or 1 when
 * alone), i = 0 on the calling thread, then any part whose worker has not
 * started it (so a descheduled worker holds nothing up), and returns when
 * all have returned. Callers
 * on different threads take turns (one task at a time, so each index's
 * scratch has one user); a task must not call run itself. */
void vlmd_cpu_pool_run(vlmd_cpu_pool *p, vlmd_cpu_task fn, void *ctx, bool alone);

/* Thread index's scratch: VLMD_CPU_SCRATCH_BYTES, 64-byte aligned, owned by
 * the pool; valid only inside the task running as that index. */
void *vlmd_cpu_pool_scratch(vlmd_cpu_pool *p, int index);

/* Part index of count of [0, total) in whole multiples of `align` (the last
 * part takes the rest): [*lo, *hi), possibly empty. */
void vlmd_cpu_split(int total, int align, int index, int count, int *lo, int *hi);

#endif
