/* launcher.c - `vlmd serve --model DIR [flags]`: the embedded default.
 *
 * Creates the instance's runtime directory (runtime_dir.c: ipc sockets and
 * the embedding arena live there, so two instances never share a path) and
 * reserves the arena in it (no room: a refusal with the numbers),
 * starts the router, the visual worker, the engine and the frontend with one set of flags (each receives exactly the
 * flags it reads, from the flag table), follows the router's snapshots as a
 * peer of its own, prints how to call the server once every process is
 * ready, restarts what exits (supervisor.c), and on SIGTERM/SIGINT stops
 * them all and removes the runtime directory. Exits 0 after a clean stop,
 * 1 when a process could not be kept running, 2 on bad flags. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "buf.h"
#include "clock.h"
#include "host_memory.h"
#include "log.h"
#include "model_config.h"
#include "peer.h"
#include "process.h"
#include "runtime_dir.h"
#include "shm_arena.h"
#include "supervisor.h"

#define IPC_PATH_MAX 100 /* sun_path is 108 bytes with the NUL; keep a margin */
/* A router that has not answered since it started gets at least this long:
 * start-up (bind, first snapshot) may be slow on a loaded host. */
#define ROUTER_START_GRACE_MS 10000

/* What the launcher sees of a child beyond the router's word: whether its
 * loop thread computes while it is silent (busy) or not (hung). */
typedef struct child_watch {
    int64_t pid;                    /* the incarnation last sampled */
    int64_t cpu_ms;                 /* its loop thread's CPU time then */
    uint64_t sampled_ms;
    bool busy;                      /* it computed since the sample before (a blocked,
                                     * stopped or deadlocked thread gains not one tick; a
                                     * busy one on a loaded host may gain few) */
    uint64_t silent_since_ms;       /* 0 while it answers */
} child_watch;

typedef struct launcher {
    vlmd_config cfg;
    vlmd_model_config model;
    uv_loop_t loop;
    void *zctx;
    vlmd_peer *peer;
    supervisor sup;
    uv_signal_t sigterm, sigint;
    uv_timer_t start_timer;
    uv_timer_t router_watch;        /* kills a router that stopped answering */
    uint64_t router_heard_ms;       /* monotonic time of the router's last message */
    uint64_t watch_tick_ms;
    child_watch watch[SUPERVISOR_MAX_CHILDREN]; /* by child index */
    runtime_dir dir;
    char ipc_path[PATH_MAX];        /* the router's socket file, "" for tcp:// */
    char arena_path[PATH_MAX];      /* the embedding arena when the launcher chose it, else "" */
    bool announced;
    bool stopping;
    int exit_code;
} launcher;

static void launcher_stop(launcher *l, int exit_code)
{
    if (l->stopping)
        return;
    l->stopping = true;
    l->exit_code = exit_code;
    uv_timer_stop(&l->start_timer);
    uv_timer_stop(&l->router_watch);
    supervisor_stop(&l->sup);
}

/* ---- busy or hung ------------------------------------------------------- */

/* Samples the CPU time of the loop thread of process pid, at most every
 * WATCH_SAMPLE_MS (a verdict over a shorter time would be noise: the clock
 * counts in ticks of 10 ms). */
#define WATCH_SAMPLE_MS 250
static void watch_sample(child_watch *w, int64_t pid, uint64_t now)
{
    uint64_t wall = now - w->sampled_ms;
    if (w->pid == pid && wall < WATCH_SAMPLE_MS)
        return;
    int64_t cpu = vlmd_process_loop_cpu_ms(pid);
    w->busy = w->pid == pid && cpu >= 0 && w->cpu_ms >= 0 && cpu > w->cpu_ms;
    if (w->pid != pid)
        w->silent_since_ms = 0;
    w->pid = pid;
    w->cpu_ms = cpu;
    w->sampled_ms = now;
}

/* A child that stopped answering: hung, to be killed, unless it is busy and
 * has been silent for less than --busy-timeout-ms past the heartbeat
 * timeout. Says so once when it spares one. */
static bool watch_hung(launcher *l, child_watch *w, const child *c, uint64_t now)
{
    if (!w->silent_since_ms)
        w->silent_since_ms = now;
    uint64_t silent = now - w->silent_since_ms;
    if (!w->busy || silent > (uint64_t)l->cfg.busy_timeout_ms)
        return true;
    if (silent == 0)
        VLMD_WARN("%s (pid %lld) is not answering but its loop is computing: busy, not hung; "
                  "it has %lld ms more (--busy-timeout-ms)", vlmd_role_process_name(c->role),
                  (long long)c->pid, (long long)l->cfg.busy_timeout_ms);
    return false;
}

/* ---- following the router ---------------------------------------------- */

static bool all_ready(const vlmd_msg_stats_snapshot *s)
{
    if (s->n_workers == 0)
        return false;
    for (uint32_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].state != VLMD_WORKER_READY)
            return false;
    return true;
}

static void announce(launcher *l, const vlmd_msg_stats_snapshot *s)
{
    const char *url = "";
    for (uint32_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].role == VLMD_ROLE_FRONTEND)
            url = s->workers[i].listen_url;
    printf("vlmd is ready: %s serves %s\n", url, l->cfg.model);
    if (strcmp(l->cfg.ui, "on") == 0) /* the console first: a newcomer opens it in a browser */
        printf("  the console: open %s/ in a browser\n", url);
    printf("  curl %s/health\n"
           "  curl %s/v1/models\n"
           "  curl %s/v1/completions -H 'Content-Type: application/json' \\\n"
           "       -d '{\"prompt\": \"Hello, my name is\", \"max_tokens\": 16}'\n",
           url, url, url);
    fflush(stdout);
    VLMD_INFO("every process is ready; serving at %s", url);
}

/* The launcher's restart counts are the true ones (a restarted router
 * starts counting from none): sent whenever a snapshot shows others. */
static void correct_restart_counts(launcher *l, const vlmd_msg_stats_snapshot *s)
{
    bool differ = false;
    for (uint32_t i = 0; i < s->n_workers; i++) {
        const child *c = supervisor_find(&l->sup, (vlmd_role)s->workers[i].role,
                                         s->workers[i].rank);
        differ = differ || (c && c->restarts != s->workers[i].restarts);
    }
    if (!differ)
        return;
    vlmd_restart_count counts[SUPERVISOR_MAX_CHILDREN];
    for (int i = 0; i < l->sup.n_children; i++) {
        const child *c = &l->sup.children[i];
        counts[i] = (vlmd_restart_count){.role = c->role, .rank = c->rank,
                                         .restarts = c->restarts};
    }
    vlmd_msg m = {.type = VLMD_MSG_RESTARTS};
    m.u.restarts = (vlmd_msg_restarts){counts, (uint32_t)l->sup.n_children};
    vlmd_peer_send(l->peer, &m);
}

static void on_router_message(vlmd_peer *peer, vlmd_msg *msg, void *ud)
{
    (void)peer;
    launcher *l = ud;
    uint64_t now = vlmd_now_ms();
    l->router_heard_ms = now;
    if (msg->type != VLMD_MSG_STATS_SNAPSHOT)
        return;
    const vlmd_msg_stats_snapshot *s = &msg->u.stats_snapshot;
    for (uint32_t i = 0; i < s->n_workers; i++) {
        const vlmd_worker_info *w = &s->workers[i];
        if (w->state == VLMD_WORKER_READY)
            supervisor_mark_ready(&l->sup, (vlmd_role)w->role, w->rank, w->pid);
        /* --port 0: a restarted frontend takes the port the first one was given */
        const char *colon = w->role == VLMD_ROLE_FRONTEND && w->state == VLMD_WORKER_READY
                                ? strrchr(w->listen_url, ':')
                                : NULL;
        if (colon && l->cfg.port == 0)
            l->cfg.port = strtol(colon + 1, NULL, 10);
        /* down to the router but still running: it missed its heartbeats; hung
         * unless its loop computes, then killed, so that the supervisor starts a
         * working one */
        child *c = supervisor_find(&l->sup, (vlmd_role)w->role, w->rank);
        if (!c || !c->spawn || !c->pid || c->pid != w->pid || c->role == VLMD_ROLE_ROUTER)
            continue; /* (the router is watched by router_watch) */
        child_watch *cw = &l->watch[c - l->sup.children];
        watch_sample(cw, c->pid, now);
        if (w->state != VLMD_WORKER_DOWN) {
            cw->silent_since_ms = 0;
        } else if (!l->stopping && watch_hung(l, cw, c, now)) {
            VLMD_WARN("%s (pid %lld) stopped answering: killing it to restart it",
                      vlmd_role_process_name(c->role), (long long)c->pid);
            kill((pid_t)c->pid, SIGKILL);
        }
    }
    correct_restart_counts(l, s);
    if (!l->announced && !l->stopping && all_ready(s)) {
        l->announced = true;
        uv_timer_stop(&l->start_timer);
        announce(l, s);
    }
}

/* The router is watched as it watches the others: one that sends nothing
 * (its snapshots come every --heartbeat-ms) for --heartbeat-timeout-ms is
 * hung, and is killed so that the supervisor starts a working one. */
static void on_router_watch(uv_timer_t *t)
{
    launcher *l = t->data;
    uint64_t now = vlmd_now_ms(), timeout = (uint64_t)l->cfg.heartbeat_timeout_ms;
    if (vlmd_clock_watcher_paused(&l->watch_tick_ms, now, timeout / 2))
        l->router_heard_ms = now; /* the launcher was the one not running */
    child *c = supervisor_find(&l->sup, VLMD_ROLE_ROUTER, 0);
    if (l->stopping || !c || !c->pid)
        return;
    bool heard = l->router_heard_ms >= c->spawned_ms;
    uint64_t since = heard ? l->router_heard_ms : c->spawned_ms;
    uint64_t allowed = heard || timeout > ROUTER_START_GRACE_MS ? timeout : ROUTER_START_GRACE_MS;
    child_watch *cw = &l->watch[c - l->sup.children];
    watch_sample(cw, c->pid, now);
    if (now - since <= allowed) {
        cw->silent_since_ms = 0;
        return;
    }
    if (!watch_hung(l, cw, c, now))
        return;
    VLMD_WARN("%s (pid %lld) sent nothing for %llu ms (--heartbeat-timeout-ms): killing it to "
              "restart it", vlmd_role_process_name(c->role), (long long)c->pid,
              (unsigned long long)(now - since));
    kill((pid_t)c->pid, SIGKILL);
    l->router_heard_ms = now; /* once per incarnation: its exit restarts it */
}

/* ---- supervision callbacks --------------------------------------------- */

static void on_child_exit(supervisor *sup, child *c, int64_t pid, int64_t exit_status,
                          int term_signal)
{
    launcher *l = sup->ud;
    if (c->role == VLMD_ROLE_ROUTER || !l->peer)
        return;
    vlmd_msg m = {.type = VLMD_MSG_WORKER_EXIT};
    m.u.worker_exit = (vlmd_msg_worker_exit){
        .role = c->role,
        .rank = c->rank,
        .pid = pid,
        .exit_status = term_signal ? -1 : (int32_t)exit_status,
        .term_signal = term_signal,
    };
    vlmd_peer_send(l->peer, &m);
}

static void on_child_fail(supervisor *sup, child *c, const char *why)
{
    launcher *l = sup->ud;
    VLMD_ERROR("%s; stopping the server", why);
    if (c) {
        fprintf(stderr, "vlmd: last log lines of %s:\n", vlmd_role_process_name(c->role));
        supervisor_print_last_lines(c);
    }
    launcher_stop(l, VLMD_EXIT_FATAL);
}

static void remove_runtime_files(launcher *l)
{
    if (l->ipc_path[0] && unlink(l->ipc_path) != 0 && errno != ENOENT)
        VLMD_WARN("cannot remove %s: %s", l->ipc_path, strerror(errno));
    if (l->arena_path[0] && unlink(l->arena_path) != 0 && errno != ENOENT)
        VLMD_WARN("cannot remove %s: %s", l->arena_path, strerror(errno));
    runtime_dir_close(&l->dir);
}

/* Start-up refused before any process started: the arena the launcher put in
 * its runtime directory goes, and the directory if it made it. */
static int refuse_start(launcher *l)
{
    if (l->arena_path[0])
        unlink(l->arena_path);
    runtime_dir_close(&l->dir);
    vlmd_config_free(&l->cfg);
    return VLMD_EXIT_CONFIG;
}

static void on_all_stopped(supervisor *sup)
{
    launcher *l = sup->ud;
    vlmd_peer_destroy(l->peer);
    l->peer = NULL;
    remove_runtime_files(l);
    uv_close((uv_handle_t *)&l->sigterm, NULL);
    uv_close((uv_handle_t *)&l->sigint, NULL);
    uv_close((uv_handle_t *)&l->start_timer, NULL);
    uv_close((uv_handle_t *)&l->router_watch, NULL);
    supervisor_free(sup);
}

static void on_signal(uv_signal_t *h, int signum)
{
    launcher *l = h->data;
    if (l->stopping) {
        VLMD_WARN("second signal %d: killing every process now", signum);
        for (int i = 0; i < l->sup.n_children; i++)
            if (l->sup.children[i].pid)
                kill((pid_t)l->sup.children[i].pid, SIGKILL);
        return;
    }
    VLMD_INFO("signal %d: stopping every process", signum);
    launcher_stop(l, 0);
}

static void on_start_timeout(uv_timer_t *t)
{
    launcher *l = t->data;
    VLMD_ERROR("not every process was ready within --start-timeout-s %lld",
               (long long)l->cfg.start_timeout_s);
    for (int i = 0; i < l->sup.n_children; i++) {
        child *c = &l->sup.children[i];
        if (!c->ready_since_start) {
            fprintf(stderr, "vlmd: %s is not ready; its last log lines:\n",
                    vlmd_role_process_name(c->role));
            supervisor_print_last_lines(c);
        }
    }
    launcher_stop(l, VLMD_EXIT_FATAL);
}

/* ---- start-up ----------------------------------------------------------- */

static vlmd_status choose_endpoint(launcher *l, vlmd_error *err)
{
    if (!l->cfg.embed_arena_path[0]) {
        if (snprintf(l->arena_path, sizeof l->arena_path, "%s/" RUNTIME_DIR_ARENA_FILE, l->dir.path) >=
            (int)sizeof l->arena_path)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--runtime-dir is too long");
        free(l->cfg.embed_arena_path);
        l->cfg.embed_arena_path = vlmd_xstrdup(l->arena_path);
    }
    if (!l->cfg.router_endpoint[0]) {
        free(l->cfg.router_endpoint);
        l->cfg.router_endpoint = vlmd_asprintf("ipc://%s/" RUNTIME_DIR_SOCKET_FILE, l->dir.path);
        VLMD_ASSERT(l->cfg.router_endpoint);
    }
    if (strncmp(l->cfg.router_endpoint, "ipc://", 6) == 0) {
        const char *path = l->cfg.router_endpoint + 6;
        if (strlen(path) > IPC_PATH_MAX)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                               "ipc socket path %s is longer than %d bytes (a Unix socket limit): "
                               "choose a shorter --runtime-dir", path, IPC_PATH_MAX);
        vlmd_strlcpy(l->ipc_path, path, sizeof l->ipc_path);
    }
    return VLMD_OK;
}

/* Directory of the running executable: the other executables sit beside it. */
static void exe_dir(char *out, size_t outsz)
{
    ssize_t n = readlink("/proc/self/exe", out, outsz - 1);
    if (n <= 0)
        VLMD_FATAL("cannot find the launcher's own path: %s", strerror(errno));
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
}

static void usage(FILE *out)
{
    fprintf(out, "usage: vlmd serve --model DIR [--host 127.0.0.1] [--port 8000] [flags]\n"
                 "       vlmd serve --help     every flag, with defaults\n"
                 "       vlmd args ROLE --model DIR --router-endpoint EP [flags]\n"
                 "                             the arguments vlmd-ROLE gets from these flags\n"
                 "                             (ROLE: router, frontend, visual, llm), shell-quoted,\n"
                 "                             for running under systemd or supervisord;\n"
                 "                             llm --engine-process P: the P-th engine process\n"
                 "                             of all engines (its --data-parallel-rank and --rank)\n"
                 "       vlmd --version\n");
}

/* Prints s in single quotes, with embedded quotes escaped, for `eval`. */
static void print_shell_quoted(const char *s)
{
    putchar('\'');
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", stdout);
        else
            putchar(*s);
    }
    putchar('\'');
}

/* Takes `--engine-process P` out of argv (the deploy files' instance number: an engine
 * process's rank among every engine's, docs/ARCHITECTURE.md, Engines); -1 when absent,
 * -2 when its value is not a number. */
static long take_engine_process(int *argc, char **argv)
{
    for (int i = 3; i < *argc; i++) {
        if (strcmp(argv[i], "--engine-process") != 0)
            continue;
        char *end = NULL;
        long p = i + 1 < *argc ? strtol(argv[i + 1], &end, 10) : -1;
        if (!end || *end || end == argv[i + 1] || p < 0)
            return -2;
        memmove(argv + i, argv + i + 2, (size_t)(*argc - i - 2) * sizeof *argv);
        *argc -= 2;
        return p;
    }
    return -1;
}

/* `vlmd args ROLE [flags]`: what the launcher would pass to that process, so
 * that a process supervisor runs every process from one set of flags. */
static int print_args(int argc, char **argv)
{
    vlmd_role role = VLMD_ROLE_COUNT;
    for (int r = VLMD_ROLE_ROUTER; r < VLMD_ROLE_COUNT && argc >= 3; r++)
        if (strcmp(argv[2], vlmd_role_str((vlmd_role)r)) == 0)
            role = (vlmd_role)r;
    if (role == VLMD_ROLE_COUNT) {
        usage(stderr);
        return VLMD_EXIT_CONFIG;
    }
    long process = take_engine_process(&argc, argv);
    if (process == -2 || (process >= 0 && role != VLMD_ROLE_LLM)) {
        fprintf(stderr, "vlmd args: --engine-process takes a number, for llm only\n");
        return VLMD_EXIT_CONFIG;
    }
    vlmd_config cfg;
    vlmd_config_parse_or_exit(&cfg, VLMD_ROLE_LAUNCHER, argc, argv, 3);
    if (process >= 0) {
        vlmd_error err = {0};
        cfg.rank = process % cfg.tensor_parallel_size;
        cfg.data_parallel_rank = process / cfg.tensor_parallel_size;
        if (cfg.data_parallel_rank >= cfg.data_parallel_size ||
            vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err) != VLMD_OK) {
            fprintf(stderr, "vlmd args: --engine-process %ld: %s\n", process,
                    err.msg[0] ? err.msg : "past the engines' processes "
                                           "(--tensor-parallel-size x --data-parallel-size)");
            vlmd_config_free(&cfg);
            return VLMD_EXIT_CONFIG;
        }
    }
    if (!cfg.router_endpoint[0]) {
        fprintf(stderr, "vlmd args: --router-endpoint is required (without the launcher there is "
                        "no runtime directory to put it in)\n");
        vlmd_config_free(&cfg);
        return VLMD_EXIT_CONFIG;
    }
    int n = 0;
    char **child_args = vlmd_config_child_argv(&cfg, role, &n);
    VLMD_ASSERT(child_args);
    for (int i = 0; i < n; i++) {
        if (i)
            putchar(' ');
        print_shell_quoted(child_args[i]);
    }
    putchar('\n');
    vlmd_argv_free(child_args);
    vlmd_config_free(&cfg);
    return 0;
}

static int serve(int argc, char **argv)
{
    launcher l = {0};
    vlmd_process_ignore_sigpipe();
    vlmd_config_parse_or_exit(&l.cfg, VLMD_ROLE_LAUNCHER, argc, argv, 2);
    vlmd_log_level level = VLMD_LOG_INFO;
    vlmd_log_level_parse(l.cfg.log_level, &level, NULL);
    vlmd_log_init("vlmd", level);

    vlmd_error err = {0};
    if (l.cfg.rank != 0 || l.cfg.data_parallel_rank != 0) {
        fprintf(stderr, "vlmd: %s %lld: vlmd serve gives each engine process its own %s\n",
                l.cfg.rank ? "--rank" : "--data-parallel-rank",
                (long long)(l.cfg.rank ? l.cfg.rank : l.cfg.data_parallel_rank),
                l.cfg.rank ? "rank" : "engine");
        vlmd_config_free(&l.cfg);
        return VLMD_EXIT_CONFIG;
    }
    if (vlmd_model_config_load(l.cfg.model, &l.model, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd: %s\n", err.msg);
        vlmd_config_free(&l.cfg);
        return VLMD_EXIT_CONFIG;
    }
    /* the arena is reserved whole before anything starts (and before the host's spare memory
     * is measured, which then no longer counts its pages): no room is a refusal now, with the
     * numbers, not a SIGBUS in the visual worker later */
    uint64_t arena_bytes = l.model.has_vision ? (uint64_t)l.cfg.embed_arena_mb << 20 : 0;
    if (runtime_dir_open(&l.dir, l.cfg.runtime_dir,
                         l.cfg.embed_arena_path[0] ? 0 : arena_bytes, &err) != VLMD_OK ||
        choose_endpoint(&l, &err) != VLMD_OK ||
        (arena_bytes &&
         vlmd_shm_arena_create(l.cfg.embed_arena_path, arena_bytes, &err) != VLMD_OK)) {
        fprintf(stderr, "vlmd: %s\n", err.msg);
        return refuse_start(&l);
    }
    VLMD_INFO("model %s (%s); runtime directory %s; router at %s", l.cfg.model,
              l.model.architecture, l.dir.path, l.cfg.router_endpoint);
    /* measured once, so the visual worker and the engine (and their restarts)
     * share one device; the engine processes of this host (every rank of every engine)
     * share its memory, each given an equal part (docs/MEMORY.md §7) */
    if (l.cfg.cpu_device_mb == 0 && strcmp(l.cfg.device, "cuda") != 0) {
        int64_t processes = l.cfg.tensor_parallel_size * l.cfg.data_parallel_size;
        l.cfg.cpu_device_mb = (int64_t)(vlmd_cpu_device_bytes(0) >> 20) / processes;
        if (l.cfg.cpu_device_mb < 64) {
            fprintf(stderr, "vlmd: this machine can spare less than 64 MiB for each of the %lld "
                    "engine processes\n", (long long)processes);
            return refuse_start(&l);
        }
    }

    uv_loop_init(&l.loop);
    l.zctx = zmq_ctx_new();
    VLMD_ASSERT(l.zctx);
    uv_signal_init(&l.loop, &l.sigterm);
    uv_signal_init(&l.loop, &l.sigint);
    l.sigterm.data = l.sigint.data = &l;
    uv_signal_start(&l.sigterm, on_signal, SIGTERM);
    uv_signal_start(&l.sigint, on_signal, SIGINT);
    uv_timer_init(&l.loop, &l.start_timer);
    l.start_timer.data = &l;
    uv_timer_start(&l.start_timer, on_start_timeout, (uint64_t)l.cfg.start_timeout_s * 1000u, 0);
    uv_timer_init(&l.loop, &l.router_watch);
    l.router_watch.data = &l;
    uv_timer_start(&l.router_watch, on_router_watch, (uint64_t)l.cfg.heartbeat_ms,
                   (uint64_t)l.cfg.heartbeat_ms);

    supervisor_init(&l.sup, &l.loop, &l.cfg, &l);
    l.sup.on_exit = on_child_exit;
    l.sup.on_fail = on_child_fail;
    l.sup.on_stopped = on_all_stopped;
    char dir[PATH_MAX], exe[PATH_MAX + 32];
    exe_dir(dir, sizeof dir);
    const vlmd_role order[] = {VLMD_ROLE_ROUTER, VLMD_ROLE_VISUAL, VLMD_ROLE_LLM,
                               VLMD_ROLE_FRONTEND};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        snprintf(exe, sizeof exe, "%s/%s", dir, vlmd_role_process_name(order[i]));
        int64_t ranks = order[i] == VLMD_ROLE_LLM
                            ? l.cfg.tensor_parallel_size * l.cfg.data_parallel_size : 1;
        for (int64_t r = 0; r < ranks; r++)
            supervisor_add(&l.sup, order[i], (uint32_t)r, exe);
    }

    l.peer = vlmd_peer_create(&l.loop, l.zctx, &l.cfg, VLMD_ROLE_LAUNCHER, 0, on_router_message,
                              &l, &err);
    if (!l.peer || supervisor_start(&l.sup, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        launcher_stop(&l, VLMD_EXIT_FATAL);
    }

    uv_run(&l.loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&l.loop) != 0)
        VLMD_WARN("event loop closed with handles still open");
    zmq_ctx_term(l.zctx);
    vlmd_config_free(&l.cfg);
    VLMD_INFO("stopped (exit %d)", l.exit_code);
    return l.exit_code;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "serve") == 0)
        return serve(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "args") == 0)
        return print_args(argc, argv);
    if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
        printf("vlmd %s\n", VLMD_VERSION);
        return 0;
    }
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    return VLMD_EXIT_CONFIG;
}
