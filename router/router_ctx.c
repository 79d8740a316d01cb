/* router_ctx.c - the sends and look-ups every part of the router makes
 * (router_ctx.h). */
#include "router_ctx.h"

#include <string.h>

#include "buf.h"
#include "log.h"

void router_send(router *rt, const registry_entry *to, const vlmd_msg *msg)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_error err = {0};
    if (vlmd_msg_encode(msg, &b, &err) != VLMD_OK) {
        VLMD_ERROR("cannot encode %s: %s", vlmd_msg_type_str(msg->type), err.msg);
    } else if (vlmd_zsock_send(rt->zs, to->identity, to->id_len, b.data, b.len) != VLMD_OK) {
        VLMD_DEBUG("%s for %s-%u undeliverable", vlmd_msg_type_str(msg->type),
                   vlmd_role_str(to->role), to->rank);
    }
    vlmd_buf_free(&b);
}

void router_send_to_identity(router *rt, const void *id, size_t id_len, const vlmd_msg *msg)
{
    registry_entry tmp = {.id_len = id_len > REGISTRY_ID_MAX ? 0 : id_len};
    if (!tmp.id_len)
        return;
    memcpy(tmp.identity, id, id_len);
    router_send(rt, &tmp, msg);
}

registry_entry *router_ready_visual(router *rt)
{
    registry_entry *e = registry_find(&rt->reg, VLMD_ROLE_VISUAL, 0);
    return e && e->state == VLMD_WORKER_READY ? e : NULL;
}
