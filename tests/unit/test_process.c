/* test_process.c - what the launcher reads of a child: the CPU time of its
 * loop (main) thread, which tells a busy process from a hung one. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "process.h"

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void spin_forever(void)
{
    for (volatile unsigned long i = 0;; i++)
        ;
}

static void *spin_thread(void *arg)
{
    (void)arg;
    spin_forever();
    return NULL;
}

typedef enum { SPINS, SLEEPS, ANOTHER_THREAD_SPINS } child_kind;

static pid_t start(child_kind kind)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (kind == ANOTHER_THREAD_SPINS) {
            pthread_t t;
            pthread_create(&t, NULL, spin_thread, NULL);
        }
        if (kind == SPINS)
            spin_forever();
        for (;;)
            pause();
    }
    return pid;
}

static void end(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Loop-thread CPU ms over 400 ms of wall time. */
static int64_t used_over_400ms(pid_t pid)
{
    int64_t before = vlmd_process_loop_cpu_ms(pid);
    cr_assert_geq(before, 0);
    sleep_ms(400);
    int64_t after = vlmd_process_loop_cpu_ms(pid);
    cr_assert_geq(after, before);
    return after - before;
}

Test(process, a_busy_loop_thread_gains_cpu_time_a_sleeping_one_none)
{
    pid_t busy = start(SPINS), idle = start(SLEEPS), pool = start(ANOTHER_THREAD_SPINS);
    sleep_ms(50);
    int64_t b = used_over_400ms(busy), i = used_over_400ms(idle), p = used_over_400ms(pool);
    cr_expect_geq(b, 40, "a spinning loop thread: %lld ms of 400", (long long)b);
    cr_expect_leq(i, 20, "a sleeping one: %lld ms", (long long)i);
    cr_expect_leq(p, 20, "a sleeping loop beside a spinning thread: %lld ms (the main thread "
                  "alone counts)", (long long)p);
    kill(busy, SIGSTOP); /* stopped: hung, however busy it was */
    sleep_ms(50);
    int64_t s = used_over_400ms(busy);
    cr_expect_leq(s, 20, "a stopped one: %lld ms", (long long)s);
    end(busy);
    end(idle);
    end(pool);
    cr_expect_eq(vlmd_process_loop_cpu_ms(busy), -1, "a process gone reads -1");
}
