/* main.c - vlmd-router: flags, the process context, signals, the loop. */
#include <signal.h>
#include <stdlib.h>
#include <zmq.h>

#include "config.h"
#include "log.h"
#include "process.h"
#include "router.h"

typedef struct router_process {
    vlmd_config cfg;
    uv_loop_t loop;
    void *zctx;
    router rt;
    uv_signal_t sigterm, sigint;
} router_process;

static void on_signal(uv_signal_t *h, int signum)
{
    router_process *p = h->data;
    VLMD_INFO("signal %d: shutting down", signum);
    router_stop(&p->rt);
    uv_close((uv_handle_t *)&p->sigterm, NULL);
    uv_close((uv_handle_t *)&p->sigint, NULL);
}

int main(int argc, char **argv)
{
    router_process p = {0};
    vlmd_process_ignore_sigpipe();
    vlmd_config_parse_or_exit(&p.cfg, VLMD_ROLE_ROUTER, argc, argv, 1);
    vlmd_log_level level = VLMD_LOG_INFO;
    vlmd_log_level_parse(p.cfg.log_level, &level, NULL);
    vlmd_log_init("vlmd-router", level);
    vlmd_process_follow_launcher();

    uv_loop_init(&p.loop);
    p.zctx = zmq_ctx_new();
    VLMD_ASSERT(p.zctx);
    vlmd_error err = {0};
    vlmd_status st = router_start(&p.rt, &p.cfg, &p.loop, p.zctx, &err);
    if (st == VLMD_ERR_TOO_LARGE || st == VLMD_ERR_USAGE) {
        /* no room for the embedding arena, a missing flag: a restart would not help */
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    if (st != VLMD_OK)
        VLMD_FATAL("%s", err.msg);
    uv_signal_init(&p.loop, &p.sigterm);
    uv_signal_init(&p.loop, &p.sigint);
    p.sigterm.data = p.sigint.data = &p;
    uv_signal_start(&p.sigterm, on_signal, SIGTERM);
    uv_signal_start(&p.sigint, on_signal, SIGINT);

    uv_run(&p.loop, UV_RUN_DEFAULT);

    uv_loop_close(&p.loop);
    zmq_ctx_term(p.zctx);
    vlmd_config_free(&p.cfg);
    VLMD_INFO("stopped");
    return 0;
}
