/* images.c - the router's image stage (docs/ARCHITECTURE.md, An image's path): a request with images
 * waits here until each image's embeddings are in the shared arena, then goes
 * to the engine with their offsets.
 *
 *   submit --> take arena room per image (a repeated image: a reference to the
 *              one already there) --> IMAGE_JOB to the visual worker for each
 *              new one --> every image READY --> the KV admission queue (requests.c)
 *
 * No room in the arena: the request waits (bounded by --image-wait-ms) until
 * requests that hold images end. A failed image fails the requests that wait
 * for it (400 for a bad image, naming it); a visual worker that goes away
 * fails every waiting request with 503. A request holds its images until it
 * ends, so the engine can read them again (recomputation after preemption).
 * Failing or queueing a request is requests.c's: this file says which. */
#include "images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "model_config.h"
#include "shm_arena.h"

vlmd_status images_start(router *rt, vlmd_error *err)
{
    const vlmd_config *cfg = rt->cfg;
    if (!cfg->model || !cfg->model[0])
        return VLMD_OK; /* a router without a model (tests of the handshake) */
    vlmd_model_config mc;
    vlmd_status st = vlmd_model_config_load(cfg->model, &mc, err);
    if (st != VLMD_OK || !mc.has_vision)
        return st;
    if (!cfg->embed_arena_path[0])
        return vlmd_errorf(err, VLMD_ERR_USAGE, "--embed-arena-path is required for a model with "
                           "images (the launcher sets it)");
    uint64_t bytes = (uint64_t)cfg->embed_arena_mb << 20;
    if ((st = vlmd_shm_arena_create(cfg->embed_arena_path, bytes, err)) != VLMD_OK)
        return st;
    embed_cache_init(&rt->embeds, bytes);
    rt->embed_row_bytes = vlmd_image_token_bytes(&mc);
    rt->images_enabled = true;
    VLMD_INFO("embedding arena %s: %lld MiB, reserved", cfg->embed_arena_path,
              (long long)cfg->embed_arena_mb);
    return VLMD_OK;
}

static uint64_t image_bytes(const router *rt, const vlmd_image_ref *im)
{
    return (uint64_t)im->token_count * rt->embed_row_bytes;
}

vlmd_status images_submit(router *rt, router_request *q, vlmd_msg *msg, vlmd_error *err)
{
    const vlmd_msg_request_submit *r = &msg->u.request_submit;
    if (!rt->images_enabled)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "this model takes no images");
    if (!router_ready_visual(rt))
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the visual worker is not ready");
    uint64_t total = 0;
    for (uint32_t i = 0; i < r->n_images; i++) {
        if (!r->images[i].n_data || !r->images[i].token_count)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "image %u has no bytes or no tokens", i);
        total += image_bytes(rt, &r->images[i]);
    }
    if (total > rt->embeds.capacity)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "the images need %llu MiB of embeddings; the "
                           "arena holds %llu MiB (--embed-arena-mb)",
                           (unsigned long long)(total >> 20),
                           (unsigned long long)(rt->embeds.capacity >> 20));
    q->submit = malloc(sizeof *q->submit);
    q->hashes = malloc(r->n_images * sizeof *q->hashes);
    if (!q->submit || !q->hashes) {
        free(q->submit);
        free(q->hashes);
        q->submit = NULL;
        q->hashes = NULL;
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "the router is out of memory");
    }
    for (uint32_t i = 0; i < r->n_images; i++)
        memcpy(q->hashes[i], r->images[i].hash, 32);
    q->n_images = r->n_images;
    q->deadline_ms = vlmd_now_ms() + (uint64_t)rt->cfg->image_wait_ms;
    q->stage = STAGE_IMAGES;
    vlmd_msg_take(q->submit, msg); /* the request (image bytes included) now belongs to q */
    return VLMD_OK; /* images_advance moves it on */
}

void images_release(router *rt, router_request *q)
{
    for (uint32_t i = 0; i < q->n_held; i++)
        embed_cache_release(&rt->embeds, q->hashes[i]);
    q->n_held = 0;
}

/* Sends the job for image i of q, whose room at offset the cache just gave. */
static bool send_job(router *rt, router_request *q, uint32_t i, uint64_t offset)
{
    registry_entry *visual = router_ready_visual(rt);
    if (!visual)
        return false;
    const vlmd_image_ref *im = &q->submit->u.request_submit.images[i];
    vlmd_msg m = {.type = VLMD_MSG_IMAGE_JOB};
    m.u.image_job = (vlmd_msg_image_job){.req_id = q->req_id, .image_index = i, .data = im->data,
                                         .n_data = im->n_data, .arena_offset = offset,
                                         .token_count = im->token_count};
    memcpy(m.u.image_job.hash, im->hash, 32);
    router_send(rt, visual, &m);
    return true;
}

images_progress images_advance(router *rt, router_request *q, uint64_t now, vlmd_error *err,
                               uint32_t *error_image)
{
    vlmd_msg_request_submit *r = &q->submit->u.request_submit;
    *error_image = 0;
    if (now > q->deadline_ms) {
        vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the images waited %lld ms for room in the "
                    "embedding arena or for the visual worker (--image-wait-ms); try again",
                    (long long)rt->cfg->image_wait_ms);
        return IMAGES_FAILED;
    }
    while (q->n_held < q->n_images) {
        uint32_t i = q->n_held;
        uint64_t offset = 0;
        embed_acquire_result got = embed_cache_acquire(&rt->embeds, q->hashes[i],
                                                       image_bytes(rt, &r->images[i]), &offset);
        if (got == EMBED_NO_ROOM)
            return IMAGES_WAITING; /* until a request holding images ends */
        if (got == EMBED_NEVER_FITS) {
            *error_image = i + 1;
            vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "image %u is larger than the embedding arena "
                        "(--embed-arena-mb)", i);
            return IMAGES_FAILED;
        }
        q->n_held++;
        r->images[i].arena_offset = offset;
        if (got == EMBED_FRESH && !send_job(rt, q, i, offset)) {
            embed_cache_drop(&rt->embeds, q->hashes[i]);
            vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the visual worker is not ready");
            return IMAGES_FAILED;
        }
    }
    for (uint32_t i = 0; i < q->n_images; i++)
        if (embed_cache_find(&rt->embeds, q->hashes[i])->state != EMBED_READY)
            return IMAGES_WAITING;
    return IMAGES_READY;
}

int images_held_index(const router_request *q, const uint8_t hash[32])
{
    for (uint32_t i = 0; i < q->n_held; i++)
        if (memcmp(q->hashes[i], hash, 32) == 0)
            return (int)i;
    return -1;
}

vlmd_status images_result(router *rt, const vlmd_msg_image_result *m)
{
    const uint8_t *hash = m->image.hash;
    const embed_entry *e = embed_cache_find(&rt->embeds, hash);
    if (!e || e->state != EMBED_ENCODING) {
        rt->dropped++; /* late (its entry was dropped) or never asked for */
        return VLMD_OK;
    }
    if (m->status == VLMD_OK) {
        embed_cache_mark_ready(&rt->embeds, hash);
        return VLMD_OK; /* images_advance finds what is now complete */
    }
    embed_cache_drop(&rt->embeds, hash);
    return m->status < VLMD_STATUS_COUNT ? (vlmd_status)m->status : VLMD_ERR_INTERNAL;
}

void images_visual_down(router *rt)
{
    for (size_t i = 0; i < rt->embeds.n;) {
        if (rt->embeds.entries[i].state == EMBED_ENCODING)
            embed_cache_drop(&rt->embeds, rt->embeds.entries[i].hash);
        else
            i++;
    }
}
