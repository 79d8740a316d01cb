/* test_ranks.h - what the tests that fork rank processes share (test_comm,
 * test_tp): a monotonic clock and a bounded wait for one rank. */
#ifndef VLMD_TEST_RANKS_H
#define VLMD_TEST_RANKS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

#endif
