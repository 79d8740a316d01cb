/* main.c - vlmd-llm: the engine process.
 *
 * Start-up order (DESIGN.md §1): say hello, ask the router for the peer
 * footprint (it answers once the visual worker has reserved its memory),
 * measure the device, size the KV cache (the four-phase auto-profile of
 * DESIGN.md §4 once the model forward exists; until then the capacity is
 * reported as 0, "not measured"), then publish READY with the capacity. The
 * frontend reports ready only after that. */
#include <stdlib.h>

#include "backend.h"
#include "log.h"
#include "process.h"
#include "service.h"

typedef struct llm_worker {
    vlmd_service svc;
    vlmd_backend *backend;
    bool profiled;
} llm_worker;

/* Runs once the peer footprint is known. */
static void llm_profile(llm_worker *w, uint64_t peer_bytes)
{
    vlmd_error err = {0};
    uint64_t free_bytes = 0, total_bytes = 0;
    if (vlmd_backend_mem_info(w->backend, &free_bytes, &total_bytes, &err) != VLMD_OK)
        VLMD_FATAL("%s", err.msg);
    const vlmd_text_config *t = &w->svc.model.text;
    uint64_t kv_bytes_per_token = (uint64_t)(t->num_layers * t->num_kv_heads * t->head_dim) * 2u *
                                  sizeof(float);
    VLMD_INFO("device %s: %llu MiB total, %llu MiB free, peers reserve %llu MiB; "
              "KV needs %llu bytes per token",
              vlmd_backend_info(w->backend)->name, (unsigned long long)(total_bytes >> 20),
              (unsigned long long)(free_bytes >> 20), (unsigned long long)(peer_bytes >> 20),
              (unsigned long long)kv_bytes_per_token);
    w->profiled = true;
    vlmd_msg_ready ready = {.device = (char *)vlmd_backend_info(w->backend)->name}; /* copied */
    vlmd_peer_set_ready(w->svc.peer, &ready);
}

static void on_message(vlmd_service *svc, const vlmd_msg *msg, void *ud)
{
    llm_worker *w = ud;
    switch (msg->type) {
    case VLMD_MSG_WELCOME:
        if (!w->profiled) {
            vlmd_msg req = {.type = VLMD_MSG_FOOTPRINT_REQUEST};
            vlmd_peer_send(svc->peer, &req);
        }
        break;
    case VLMD_MSG_FOOTPRINT_REPLY:
        if (!w->profiled)
            llm_profile(w, msg->u.footprint_reply.peer_bytes);
        break;
    default:
        VLMD_WARN("ignored an unexpected %s message", vlmd_msg_type_str(msg->type));
        break;
    }
}

static void on_stop(vlmd_service *svc, void *ud)
{
    (void)svc;
    llm_worker *w = ud;
    vlmd_backend_destroy(w->backend);
    w->backend = NULL;
}

int main(int argc, char **argv)
{
    llm_worker w = {0};
    vlmd_service_init(&w.svc, VLMD_ROLE_LLM, argc, argv);
    vlmd_error err = {0};
    if (vlmd_backend_create(w.svc.cfg.device, &w.backend, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    const vlmd_text_config *t = &w.svc.model.text;
    VLMD_INFO("%s: %lld layers, hidden %lld, %lld heads (%lld KV), vocab %lld, max length %lld",
              w.svc.model.architecture, (long long)t->num_layers, (long long)t->hidden_size,
              (long long)t->num_heads, (long long)t->num_kv_heads, (long long)t->vocab_size,
              (long long)t->max_position_embeddings);
    vlmd_service_start(&w.svc, on_message, on_stop, &w);
    return vlmd_service_run(&w.svc);
}
