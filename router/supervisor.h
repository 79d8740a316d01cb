/* supervisor.h - the launcher's children: spawn, capture stderr, restart with
 * backoff, give up when a child cannot start, stop in order.
 *
 * Each child is one process of vlmd (router, visual, llm, frontend). Its
 * stderr is read through a pipe, copied to the launcher's stderr line by
 * line, and the last lines are kept so that a failure can show them.
 * Restart policy: exponential backoff from --restart-backoff-ms to
 * --restart-backoff-max-ms, and that longest delay for a child that restarted
 * more than --max-restarts-per-minute times in a minute; a child that exits
 * with VLMD_EXIT_CONFIG, or three times in a row before becoming ready, makes
 * the whole server stop with an error. A child that becomes ready never stops
 * it, however often it ends: what ends it may be one client's traffic. An engine's ranks (--tensor-parallel-size > 1) are one
 * group: the first of them to exit ends its generation, the others of that
 * generation are killed, and each is restarted into the next one, so a group
 * never serves with a rank missing or a rank of an older group. Engines
 * (--data-parallel-size) restart apart: one's exit leaves the others alone.
 * An engine process's rank here is its rank among all engines' processes
 * (vlmd_config_process_rank). */
#ifndef VLMD_SUPERVISOR_H
#define VLMD_SUPERVISOR_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"

#define SUPERVISOR_LAST_LINES 20
#define SUPERVISOR_LINE_MAX 2048
#define SUPERVISOR_MAX_RESTART_WINDOW 1001
#define SUPERVISOR_FAILS_BEFORE_GIVING_UP 3

typedef struct supervisor supervisor;
struct child_spawn;

typedef struct child {
    supervisor *sup;
    vlmd_role role;
    uint32_t rank;                  /* an engine process's: among every engine's */
    uint32_t engine;                /* an engine process's engine (--data-parallel-size) */
    char exe[4096];
    struct child_spawn *spawn;      /* the running incarnation, NULL when none */
    int64_t pid;                    /* of the running incarnation, 0 when none */
    uint64_t spawned_ms;            /* monotonic time the running incarnation started */
    bool ready_since_start;         /* reported ready since its last spawn */
    bool term_sent;                 /* stopping: SIGTERM sent to the running incarnation */
    bool in_group;                  /* one of an engine's ranks: they restart together */
    uint32_t group_gen;             /* its engine's generation it was spawned in */
    int fails_in_a_row;             /* exits before becoming ready */
    uint32_t restarts;
    uint64_t restart_times_ms[SUPERVISOR_MAX_RESTART_WINDOW]; /* ring of recent restarts */
    int n_restart_times;
    uv_timer_t restart_timer;
    char *last_lines[SUPERVISOR_LAST_LINES]; /* ring; owned */
    int line_head;
    char partial[SUPERVISOR_LINE_MAX];
    size_t partial_len;
} child;

/* Called when a child exits (after the supervisor has logged it). */
typedef void (*supervisor_exit_fn)(supervisor *sup, child *c, int64_t pid, int64_t exit_status,
                                   int term_signal);
/* Called when the supervisor gives up (the message says why); the owner
 * should then stop everything. */
typedef void (*supervisor_fail_fn)(supervisor *sup, child *c, const char *why);
/* Called once every child has exited during a stop. */
typedef void (*supervisor_stopped_fn)(supervisor *sup);

#define SUPERVISOR_MAX_CHILDREN 20

struct supervisor {
    uv_loop_t *loop;                /* borrowed */
    const vlmd_config *cfg;         /* borrowed: restart policy, child flags */
    child children[SUPERVISOR_MAX_CHILDREN];
    int n_children;
    bool stopping;
    uv_timer_t kill_timer;
    uint32_t group_gen[SUPERVISOR_MAX_CHILDREN]; /* per engine: grows each time a rank's exit
                                                  * ends the group */
    supervisor_exit_fn on_exit;
    supervisor_fail_fn on_fail;
    supervisor_stopped_fn on_stopped;
    void *ud;
};

void supervisor_init(supervisor *sup, uv_loop_t *loop, const vlmd_config *cfg, void *ud);
/* Adds a child running exe (path) as role; spawned by supervisor_start. */
child *supervisor_add(supervisor *sup, vlmd_role role, uint32_t rank, const char *exe);
/* Spawns every child in the order added. */
vlmd_status supervisor_start(supervisor *sup, vlmd_error *err);
/* The child running with this role/rank, or NULL. */
child *supervisor_find(supervisor *sup, vlmd_role role, uint32_t rank);
/* Records that a child (identified by pid) reported ready: resets its failure count. */
void supervisor_mark_ready(supervisor *sup, vlmd_role role, uint32_t rank, int64_t pid);
/* Stops every child: SIGTERM to the others first, the router last, SIGKILL
 * after --shutdown-timeout-ms; on_stopped runs when all have exited. */
void supervisor_stop(supervisor *sup);
/* Writes a child's last log lines to stderr, oldest first. */
void supervisor_print_last_lines(const child *c);
/* Frees the line buffers and closes the timers (after every child exited). */
void supervisor_free(supervisor *sup);

#endif
