/* service.c - the shared skeleton of worker processes (see service.h). */
#include "service.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "log.h"
#include "process.h"

static void on_signal(uv_signal_t *h, int signum)
{
    vlmd_service *svc = h->data;
    if (svc->on_drain && !svc->draining && !svc->stopping) {
        svc->draining = true; /* a second signal stops at once */
        VLMD_INFO("%s: draining", signum == SIGTERM ? "SIGTERM" : "SIGINT");
        svc->on_drain(svc, svc->ud);
        return;
    }
    vlmd_service_stop(svc, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void on_peer_message(vlmd_peer *peer, vlmd_msg *msg, void *ud)
{
    (void)peer;
    vlmd_service *svc = ud;
    if (msg->type == VLMD_MSG_SHUTDOWN) {
        VLMD_INFO("router asked to shut down: %s", msg->u.shutdown.reason);
        vlmd_service_stop(svc, "shutdown message");
        return;
    }
    if (svc->on_message && !svc->stopping)
        svc->on_message(svc, msg, svc->ud);
}

void vlmd_service_init(vlmd_service *svc, vlmd_role role, int argc, char **argv)
{
    memset(svc, 0, sizeof *svc);
    svc->role = role;
    vlmd_process_ignore_sigpipe();
    vlmd_config_parse_or_exit(&svc->cfg, role, argc, argv, 1);
    vlmd_log_level level = VLMD_LOG_INFO;
    vlmd_log_level_parse(svc->cfg.log_level, &level, NULL);
    vlmd_log_init(vlmd_role_process_name(role), level);
    vlmd_error err = {0};
    if (vlmd_model_config_load(svc->cfg.model, &svc->model, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    vlmd_process_follow_launcher();
    uv_loop_init(&svc->loop);
    svc->zctx = zmq_ctx_new();
    VLMD_ASSERT(svc->zctx);
}

void vlmd_service_start(vlmd_service *svc, vlmd_service_msg_fn on_message,
                        vlmd_service_stop_fn on_stop, void *ud)
{
    svc->on_message = on_message;
    svc->on_stop = on_stop;
    svc->ud = ud;
    vlmd_error err = {0};
    svc->peer = vlmd_peer_create(&svc->loop, svc->zctx, &svc->cfg, svc->role,
                                 (uint32_t)vlmd_config_process_rank(&svc->cfg), on_peer_message,
                                 svc, &err);
    if (!svc->peer)
        VLMD_FATAL("%s", err.msg);
    uv_signal_init(&svc->loop, &svc->sigterm);
    uv_signal_init(&svc->loop, &svc->sigint);
    svc->sigterm.data = svc->sigint.data = svc;
    uv_signal_start(&svc->sigterm, on_signal, SIGTERM);
    uv_signal_start(&svc->sigint, on_signal, SIGINT);
}

void vlmd_service_stop(vlmd_service *svc, const char *why)
{
    if (svc->stopping)
        return;
    svc->stopping = true;
    VLMD_INFO("stopping (%s)", why);
    if (svc->on_stop)
        svc->on_stop(svc, svc->ud);
    vlmd_peer_destroy(svc->peer);
    svc->peer = NULL;
    uv_close((uv_handle_t *)&svc->sigterm, NULL);
    uv_close((uv_handle_t *)&svc->sigint, NULL);
}

int vlmd_service_run(vlmd_service *svc)
{
    uv_run(&svc->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&svc->loop);
    if (rc != 0)
        VLMD_WARN("event loop closed with handles still open: %s", uv_strerror(rc));
    zmq_ctx_term(svc->zctx);
    vlmd_config_free(&svc->cfg);
    VLMD_INFO("stopped");
    return 0;
}
