/* main.c - vlmd-visual: the visual (ViT) worker.
 *
 * Start-up: read the model's vision config, open the backend, reserve the
 * device memory of the worst case (the stress-reserve of DESIGN.md §4, which
 * runs the vision tower once it exists; until then the reservation is zero),
 * then report READY with the reserved bytes, which the router passes to the
 * engine as the peer footprint. */
#include <stdlib.h>

#include "backend.h"
#include "log.h"
#include "process.h"
#include "service.h"

typedef struct visual_worker {
    vlmd_service svc;
    vlmd_backend *backend;
    uint64_t reserved_bytes;
} visual_worker;

static void on_message(vlmd_service *svc, const vlmd_msg *msg, void *ud)
{
    (void)svc;
    (void)ud;
    if (msg->type != VLMD_MSG_WELCOME)
        VLMD_WARN("ignored an unexpected %s message", vlmd_msg_type_str(msg->type));
}

static void on_stop(vlmd_service *svc, void *ud)
{
    (void)svc;
    visual_worker *w = ud;
    vlmd_backend_destroy(w->backend);
    w->backend = NULL;
}

int main(int argc, char **argv)
{
    visual_worker w = {0};
    vlmd_service_init(&w.svc, VLMD_ROLE_VISUAL, argc, argv);
    vlmd_error err = {0};
    if (vlmd_backend_create(w.svc.cfg.device, &w.backend, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    const vlmd_device_info *dev = vlmd_backend_info(w.backend);
    const vlmd_model_config *m = &w.svc.model;
    if (m->has_vision)
        VLMD_INFO("%s vision tower: depth %lld, width %lld, patch %lld, merge %lld; device %s",
                  m->architecture, (long long)m->vision.depth, (long long)m->vision.embed_dim,
                  (long long)m->vision.patch_size, (long long)m->vision.spatial_merge_size,
                  dev->name);
    else
        VLMD_INFO("%s has no vision tower: this worker reserves nothing", m->architecture);

    vlmd_service_start(&w.svc, on_message, on_stop, &w);
    /* device is borrowed for the call (set_ready copies it) */
    vlmd_msg_ready ready = {.reserved_bytes = w.reserved_bytes, .device = (char *)dev->name};
    vlmd_peer_set_ready(w.svc.peer, &ready);
    return vlmd_service_run(&w.svc);
}
