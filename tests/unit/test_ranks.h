/* test_ranks.h - what the tests that fork rank processes share (test_comm,
 * test_tp, test_tp_profile): a monotonic clock, a bounded wait for one rank
 * and for a group, and a CPU rendezvous in a directory of its own. */
#ifndef VLMD_TEST_RANKS_H
#define VLMD_TEST_RANKS_H

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"

static inline int64_t test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for rank process pid until deadline_ms (test_now_ms's clock): its
 * exit status, or -1 when it did not exit normally. One still running at the
 * deadline is killed (*killed true), so a hung rank never hangs the test. */
static inline int test_wait_rank(pid_t pid, int64_t deadline_ms, bool *killed)
{
    int ws = 0;
    pid_t got;
    *killed = false;
    while ((got = waitpid(pid, &ws, WNOHANG)) == 0 && test_now_ms() < deadline_ms) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &ws, 0);
        *killed = true;
        return -1;
    }
    return got > 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* Waits for the world ranks (pids) together, until wait_s seconds from now:
 * codes[r] is rank r's exit status (-1 when it was killed at the deadline,
 * which is logged). */
static inline void test_wait_group(const pid_t *pids, int world, int wait_s, int *codes)
{
    int64_t deadline = test_now_ms() + (int64_t)wait_s * 1000;
    for (int r = 0; r < world; r++) {
        bool killed;
        codes[r] = test_wait_rank(pids[r], deadline, &killed);
        if (killed)
            cr_log_error("rank %d of %d did not finish within %d s: killed", r, world, wait_s);
    }
}

/* A CPU rendezvous for a group, in a new directory /dev/shm/PREFIX-XXXXXX
 * (dir: its path), which must be empty once the group is done. */
static inline void test_group_id(const char *prefix, char (*dir)[64], vlmd_comm_id *id)
{
    snprintf(*dir, sizeof *dir, "/dev/shm/%s-XXXXXX", prefix);
    cr_assert_not_null(mkdtemp(*dir), "mkdtemp: %s", strerror(errno));
    vlmd_error err = {0};
    cr_assert_eq(vlmd_comm_id_make(VLMD_DEVICE_CPU, *dir, id, &err), VLMD_OK, "%s", err.msg);
}

#endif
