/* supervisor.c - spawning, stderr capture, restarts and ordered stop of the
 * launcher's children (policy in supervisor.h). Each incarnation of a child
 * is a heap `child_spawn` holding its process and stderr pipe handles; it is
 * freed when libuv has closed both, so a restart never reuses a handle that
 * is still closing. */
#include "supervisor.h"

#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "clock.h"
#include "log.h"
#include "process.h"

static void stop_next_stage(supervisor *sup);

extern char **environ;

typedef struct child_spawn {
    child *owner;                   /* NULL once the owner moved on */
    uv_process_t proc;
    uv_pipe_t err_pipe;
    int open_handles;
    bool exited;
    bool pipe_closed;
} child_spawn;

static char read_buf[64 * 1024];

static void spawn_release(uv_handle_t *h)
{
    child_spawn *s = h->data;
    if (--s->open_handles == 0)
        free(s);
}

/* ---- stderr capture ---------------------------------------------------- */

static void keep_line(child *c, const char *line, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy)
        return;
    memcpy(copy, line, len);
    copy[len] = '\0';
    free(c->last_lines[c->line_head]);
    c->last_lines[c->line_head] = copy;
    c->line_head = (c->line_head + 1) % SUPERVISOR_LAST_LINES;
}

/* Copies complete lines to our stderr and keeps them; buffers a partial one. */
static void take_output(child *c, const char *data, size_t len)
{
    ssize_t w = write(STDERR_FILENO, data, len);
    (void)w; /* our own stderr is gone: nothing better to do */
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\n' || c->partial_len == sizeof c->partial - 1) {
            keep_line(c, c->partial, c->partial_len);
            c->partial_len = 0;
            if (data[i] == '\n')
                continue;
        }
        c->partial[c->partial_len++] = data[i];
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(read_buf, sizeof read_buf);
}

static void close_pipe(child_spawn *s)
{
    if (s->pipe_closed)
        return;
    s->pipe_closed = true;
    uv_close((uv_handle_t *)&s->err_pipe, spawn_release);
}

static void on_read(uv_stream_t *stream, ssize_t n, const uv_buf_t *buf)
{
    child_spawn *s = stream->data;
    if (n > 0 && s->owner)
        take_output(s->owner, buf->base, (size_t)n);
    if (n < 0) {
        if (s->owner && s->owner->partial_len) {
            keep_line(s->owner, s->owner->partial, s->owner->partial_len);
            s->owner->partial_len = 0;
        }
        close_pipe(s);
    }
}

void supervisor_print_last_lines(const child *c)
{
    for (int i = 0; i < SUPERVISOR_LAST_LINES; i++) {
        const char *line = c->last_lines[(c->line_head + i) % SUPERVISOR_LAST_LINES];
        if (line)
            fprintf(stderr, "    | %s\n", line);
    }
}

/* ---- spawning and restarts --------------------------------------------- */

static void on_exit_cb(uv_process_t *proc, int64_t exit_status, int term_signal);
static void spawn_child(child *c);

static bool all_exited(const supervisor *sup)
{
    for (int i = 0; i < sup->n_children; i++)
        if (sup->children[i].spawn)
            return false;
    return true;
}

static void fail(supervisor *sup, child *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(supervisor *sup, child *c, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (sup->on_fail)
        sup->on_fail(sup, c, why);
}

/* Backoff before the next restart: base << fails, capped. */
static uint64_t restart_delay_ms(const supervisor *sup, const child *c)
{
    uint64_t delay = (uint64_t)sup->cfg->restart_backoff_ms;
    for (int i = 0; i < c->fails_in_a_row && delay < (uint64_t)sup->cfg->restart_backoff_max_ms; i++)
        delay *= 2;
    if (delay > (uint64_t)sup->cfg->restart_backoff_max_ms)
        delay = (uint64_t)sup->cfg->restart_backoff_max_ms;
    return delay;
}

/* Counts restarts within the last minute, including one at now. */
static int restarts_last_minute(child *c, uint64_t now)
{
    int window = SUPERVISOR_MAX_RESTART_WINDOW;
    c->restart_times_ms[c->n_restart_times % window] = now;
    c->n_restart_times++;
    int n = 0;
    int have = c->n_restart_times < window ? c->n_restart_times : window;
    for (int i = 0; i < have; i++)
        if (now - c->restart_times_ms[i] < 60000)
            n++;
    return n;
}

static void on_restart_timer(uv_timer_t *t)
{
    child *c = t->data;
    if (c->sup->stopping)
        return;
    c->restarts++;
    VLMD_INFO("restarting %s (restart %u)", vlmd_role_process_name(c->role), c->restarts);
    spawn_child(c);
}

/* A rank of the current group exited: the group's other ranks are killed
 * (their collectives would only fail at their timeout) and every rank
 * restarts into the next generation. */
static void end_group(supervisor *sup, const child *dead)
{
    uint32_t gen = ++sup->group_gen[dead->engine];
    for (int i = 0; i < sup->n_children; i++) {
        child *c = &sup->children[i];
        if (c == dead || !c->in_group || c->engine != dead->engine || !c->spawn || !c->pid ||
            c->group_gen >= gen)
            continue;
        VLMD_WARN("%s rank %u (pid %lld): its group lost rank %u; killing it to restart the "
                  "group", vlmd_role_process_name(c->role), c->rank, (long long)c->pid,
                  dead->rank);
        kill((pid_t)c->pid, SIGKILL);
    }
}

static void on_exit_cb(uv_process_t *proc, int64_t exit_status, int term_signal)
{
    child_spawn *s = proc->data;
    s->exited = true;
    uv_close((uv_handle_t *)proc, spawn_release);
    child *c = s->owner;
    if (!c)
        return;
    supervisor *sup = c->sup;
    int64_t pid = c->pid;
    s->owner = NULL; /* stderr may still drain; the lines are no longer ours to keep */
    c->spawn = NULL;
    c->pid = 0;
    if (c->partial_len) {
        keep_line(c, c->partial, c->partial_len);
        c->partial_len = 0;
    }
    const char *name = vlmd_role_process_name(c->role);
    if (sup->stopping && !term_signal && exit_status == 0) {
        VLMD_INFO("%s (pid %lld) stopped", name, (long long)pid);
    } else if (term_signal) {
        VLMD_WARN("%s (pid %lld) was killed by signal %d", name, (long long)pid, term_signal);
    } else {
        VLMD_WARN("%s (pid %lld) exited with status %lld", name, (long long)pid,
                  (long long)exit_status);
    }
    if (sup->on_exit)
        sup->on_exit(sup, c, pid, exit_status, term_signal);
    if (sup->stopping) {
        stop_next_stage(sup);
        if (all_exited(sup) && sup->on_stopped) {
            uv_timer_stop(&sup->kill_timer);
            sup->on_stopped(sup);
        }
        return;
    }
    if (c->in_group && c->group_gen == sup->group_gen[c->engine])
        end_group(sup, c);
    if (!term_signal && exit_status == VLMD_EXIT_CONFIG) {
        fail(sup, c, "%s exited with a configuration error", name);
        return;
    }
    if (!c->ready_since_start)
        c->fails_in_a_row++;
    else
        c->fails_in_a_row = 0;
    if (c->fails_in_a_row >= SUPERVISOR_FAILS_BEFORE_GIVING_UP) {
        fail(sup, c, "%s exited %d times in a row before becoming ready", name, c->fails_in_a_row);
        return;
    }
    /* It became ready since its start: it works, and what ends it may be one
     * client's traffic. Restarting it often only slows its restarts down: a
     * server that stopped would serve nobody. */
    int recent = restarts_last_minute(c, vlmd_now_ms());
    uint64_t delay = restart_delay_ms(sup, c);
    if (recent > sup->cfg->max_restarts_per_minute) {
        delay = (uint64_t)sup->cfg->restart_backoff_max_ms;
        VLMD_WARN("%s needed %d restarts within a minute (--max-restarts-per-minute %lld): "
                  "restarting it every %llu ms (--restart-backoff-max-ms) while that lasts",
                  name, recent, (long long)sup->cfg->max_restarts_per_minute,
                  (unsigned long long)delay);
    }
    VLMD_INFO("%s will be restarted in %llu ms", name, (unsigned long long)delay);
    uv_timer_start(&c->restart_timer, on_restart_timer, delay, 0);
}

static void spawn_child(child *c)
{
    supervisor *sup = c->sup;
    child_spawn *s = calloc(1, sizeof *s);
    int child_argc = 0;
    vlmd_config mine = *sup->cfg; /* (borrowed strings) */
    if (c->role == VLMD_ROLE_LLM) { /* its rank in its engine, and the engine */
        mine.rank = c->rank % sup->cfg->tensor_parallel_size;
        mine.data_parallel_rank = c->engine;
    }
    char **flags = vlmd_config_child_argv(&mine, c->role, &child_argc);
    char **args = flags ? calloc((size_t)child_argc + 2, sizeof *args) : NULL;
    size_t n_env = 0;
    while (environ[n_env])
        n_env++;
    char **env = calloc(n_env + 2, sizeof *env);
    char launcher_pid[64];
    snprintf(launcher_pid, sizeof launcher_pid, "VLMD_LAUNCHER_PID=%d", (int)getpid());
    if (!s || !args || !env)
        VLMD_FATAL("out of memory spawning %s", vlmd_role_process_name(c->role));
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        if (strncmp(environ[i], "VLMD_LAUNCHER_PID=", 18) == 0)
            continue;
        /* the keys are the frontend's business alone */
        if (strncmp(environ[i], "VLMD_API_KEY=", 13) == 0 && c->role != VLMD_ROLE_FRONTEND)
            continue;
        env[k++] = environ[i];
    }
    env[k] = launcher_pid;
    args[0] = c->exe;
    memcpy(args + 1, flags, (size_t)child_argc * sizeof *args);

    uv_pipe_init(sup->loop, &s->err_pipe, 0);
    s->owner = c;
    s->proc.data = s->err_pipe.data = s;
    uv_stdio_container_t stdio[3] = {
        {.flags = UV_IGNORE},
        {.flags = UV_INHERIT_FD, .data.fd = STDOUT_FILENO},
        {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&s->err_pipe},
    };
    uv_process_options_t opts = {
        .exit_cb = on_exit_cb,
        .file = c->exe,
        .args = args,
        .env = env,
        .stdio_count = 3,
        .stdio = stdio,
    };
    int rc = uv_spawn(sup->loop, &s->proc, &opts);
    free(args);
    free(env);
    vlmd_argv_free(flags);
    if (rc != 0) {
        /* uv_spawn failed: the process handle still has to be closed. */
        s->open_handles = 2;
        s->owner = NULL;
        uv_close((uv_handle_t *)&s->proc, spawn_release);
        close_pipe(s);
        fail(sup, c, "cannot start %s: %s", c->exe, uv_strerror(rc));
        return;
    }
    s->open_handles = 2;
    c->spawn = s;
    c->pid = s->proc.pid;
    c->spawned_ms = vlmd_now_ms();
    c->term_sent = false;
    c->ready_since_start = false;
    c->group_gen = sup->group_gen[c->engine];
    uv_read_start((uv_stream_t *)&s->err_pipe, on_alloc, on_read);
    VLMD_INFO("started %s (pid %lld)", vlmd_role_process_name(c->role), (long long)c->pid);
}

/* ---- public ------------------------------------------------------------ */

void supervisor_init(supervisor *sup, uv_loop_t *loop, const vlmd_config *cfg, void *ud)
{
    memset(sup, 0, sizeof *sup);
    sup->loop = loop;
    sup->cfg = cfg;
    sup->ud = ud;
    uv_timer_init(loop, &sup->kill_timer);
    sup->kill_timer.data = sup;
}

child *supervisor_add(supervisor *sup, vlmd_role role, uint32_t rank, const char *exe)
{
    VLMD_ASSERT(sup->n_children < SUPERVISOR_MAX_CHILDREN);
    child *c = &sup->children[sup->n_children++];
    memset(c, 0, sizeof *c);
    c->sup = sup;
    c->role = role;
    c->rank = rank;
    c->in_group = role == VLMD_ROLE_LLM && sup->cfg->tensor_parallel_size > 1;
    c->engine = role == VLMD_ROLE_LLM ? rank / (uint32_t)sup->cfg->tensor_parallel_size : 0;
    vlmd_strlcpy(c->exe, exe, sizeof c->exe);
    uv_timer_init(sup->loop, &c->restart_timer);
    c->restart_timer.data = c;
    return c;
}

vlmd_status supervisor_start(supervisor *sup, vlmd_error *err)
{
    for (int i = 0; i < sup->n_children; i++) {
        if (access(sup->children[i].exe, X_OK) != 0)
            return vlmd_errorf(err, VLMD_ERR_NOT_FOUND, "cannot execute %s: %s",
                               sup->children[i].exe, strerror(errno));
    }
    for (int i = 0; i < sup->n_children && !sup->stopping; i++)
        spawn_child(&sup->children[i]);
    return VLMD_OK;
}

child *supervisor_find(supervisor *sup, vlmd_role role, uint32_t rank)
{
    for (int i = 0; i < sup->n_children; i++)
        if (sup->children[i].role == role && sup->children[i].rank == rank)
            return &sup->children[i];
    return NULL;
}

void supervisor_mark_ready(supervisor *sup, vlmd_role role, uint32_t rank, int64_t pid)
{
    child *c = supervisor_find(sup, role, rank);
    if (c && c->pid == pid && pid) {
        c->ready_since_start = true;
        c->fails_in_a_row = 0;
    }
}

/* The stop goes in stages, each once the one before has exited: the
 * frontends (they drain: their running requests finish first), then the
 * workers, then the router (the others talk to it while they stop). */
static void stop_next_stage(supervisor *sup)
{
    static const int stage_of[VLMD_ROLE_COUNT] = {[VLMD_ROLE_FRONTEND] = 0, [VLMD_ROLE_VISUAL] = 1,
                                                  [VLMD_ROLE_LLM] = 1, [VLMD_ROLE_ROUTER] = 2};
    for (int stage = 0; stage < 3; stage++) {
        bool alive = false;
        for (int i = 0; i < sup->n_children; i++) {
            child *c = &sup->children[i];
            if (c->spawn && c->pid && stage_of[c->role] == stage) {
                if (!c->term_sent)
                    kill((pid_t)c->pid, SIGTERM);
                c->term_sent = true;
                alive = true;
            }
        }
        if (alive)
            return;
    }
}

static void on_kill_timer(uv_timer_t *t)
{
    supervisor *sup = t->data;
    for (int i = 0; i < sup->n_children; i++) {
        child *c = &sup->children[i];
        if (c->spawn && c->pid) {
            VLMD_WARN("%s (pid %lld) did not stop within %lld ms: SIGKILL",
                      vlmd_role_process_name(c->role), (long long)c->pid,
                      (long long)sup->cfg->shutdown_timeout_ms);
            kill((pid_t)c->pid, SIGKILL);
        }
    }
}

void supervisor_stop(supervisor *sup)
{
    if (sup->stopping)
        return;
    sup->stopping = true;
    for (int i = 0; i < sup->n_children; i++)
        uv_timer_stop(&sup->children[i].restart_timer);
    stop_next_stage(sup);
    if (all_exited(sup)) {
        if (sup->on_stopped)
            sup->on_stopped(sup);
        return;
    }
    /* the frontend's drain comes on top of the time every process has to stop */
    uv_timer_start(&sup->kill_timer, on_kill_timer,
                   (uint64_t)sup->cfg->shutdown_timeout_ms +
                       (uint64_t)sup->cfg->drain_timeout_s * 1000,
                   0);
}

void supervisor_free(supervisor *sup)
{
    uv_close((uv_handle_t *)&sup->kill_timer, NULL);
    for (int i = 0; i < sup->n_children; i++) {
        child *c = &sup->children[i];
        uv_close((uv_handle_t *)&c->restart_timer, NULL);
        for (int j = 0; j < SUPERVISOR_LAST_LINES; j++) {
            free(c->last_lines[j]);
            c->last_lines[j] = NULL;
        }
    }
}
