/* images.c - the router's image stage (docs/ARCHITECTURE.md, An image's path): a request with images
 * waits here until each image's embeddings are in the shared arena, then goes
 * to the engine with their offsets.
 *
 *   submit --> take arena room per image (a repeated image: a reference to the
 *              one already there) --> IMAGE_JOB to the visual worker for each
 *              new one --> every image READY --> the KV admission queue (requests.c)
 *
 * A request takes room for all of its images at once or none: a request
 * that held part while waiting for the rest could stall with others doing
 * the same (issue 36). No room: the request waits (bounded by
 * --image-wait-ms) until requests that hold images end, in arrival order; a
 * later request that finds room may pass it IMAGES_MAX_ROOM_PASSES times,
 * then room waits for it. Images that need more than the whole arena are
 * refused at once. A failed image fails the requests that wait for it (400
 * for a bad image, naming it); a visual worker that goes away fails every
 * waiting request with 503. A request holds its images until it ends, so the
 * engine can read them again (recomputation after preemption). Failing or
 * queueing a request is requests.c's: this file says which. */
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

/* What the arena is asked for: each image's hash (borrowed from r) and bytes
 * (want: room for VLMD_PROTO_MAX_IMAGES, the decoder's bound on n_images). */
static void wants_of(const router *rt, const vlmd_msg_request_submit *r, embed_want *want)
{
    for (uint32_t i = 0; i < r->n_images; i++)
        want[i] = (embed_want){.hash = r->images[i].hash, .bytes = image_bytes(rt, &r->images[i])};
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1 << 20);
}

vlmd_status images_submit(router *rt, router_request *q, vlmd_msg *msg, vlmd_error *err)
{
    const vlmd_msg_request_submit *r = &msg->u.request_submit;
    if (!rt->images_enabled)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "this model takes no images");
    if (!router_ready_visual(rt))
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the visual worker is not ready");
    for (uint32_t i = 0; i < r->n_images; i++)
        if (!r->images[i].n_data || !r->images[i].token_count)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "image %u has no bytes or no tokens", i);
    embed_want want[VLMD_PROTO_MAX_IMAGES];
    wants_of(rt, r, want);
    uint64_t need = embed_cache_need(want, r->n_images); /* a repeated image once */
    if (need > rt->embeds.capacity) /* never: refused now, not after --image-wait-ms */
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "the images need %.1f MiB of embeddings; the "
                           "embedding arena holds %.1f MiB (--embed-arena-mb)", mib(need),
                           mib(rt->embeds.capacity));
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

/* Sends the job for image i of q, whose room at offset the cache just gave,
 * to the ready visual worker (the caller has checked there is one). */
static void send_job(router *rt, router_request *q, uint32_t i, uint64_t offset)
{
    registry_entry *visual = router_ready_visual(rt);
    const vlmd_image_ref *im = &q->submit->u.request_submit.images[i];
    vlmd_msg m = {.type = VLMD_MSG_IMAGE_JOB};
    m.u.image_job = (vlmd_msg_image_job){.req_id = q->req_id, .image_index = i, .data = im->data,
                                         .n_data = im->n_data, .arena_offset = offset,
                                         .token_count = im->token_count};
    memcpy(m.u.image_job.hash, im->hash, 32);
    router_send(rt, visual, &m);
}

/* Takes room for all of q's images, or finds none (false). Fresh images get
 * their jobs (the caller has checked that the visual worker is ready). */
static bool take_room(router *rt, router_request *q)
{
    vlmd_msg_request_submit *r = &q->submit->u.request_submit;
    if (q->room_freed_seen == rt->embeds.freed + 1)
        return false; /* nothing was freed since it last found none */
    embed_want want[VLMD_PROTO_MAX_IMAGES];
    wants_of(rt, r, want);
    if (!embed_cache_acquire_all(&rt->embeds, want, q->n_images)) {
        q->room_freed_seen = rt->embeds.freed + 1;
        return false;
    }
    q->n_held = q->n_images;
    for (uint32_t i = 0; i < q->n_images; i++) {
        r->images[i].arena_offset = want[i].offset;
        if (want[i].fresh)
            send_job(rt, q, i, want[i].offset);
    }
    return true;
}

/* q found no room this round: it waits, counted once, and is passed by the
 * requests after it that find room until it has been passed enough. */
static void wait_for_room(router *rt, router_request *q, images_round *round)
{
    if (!q->room_waited) {
        q->room_waited = true;
        rt->counts.arena_waits++;
    }
    if (!round->oldest)
        round->oldest = q;
    round->waiting++;
    if (q->room_passes >= IMAGES_MAX_ROOM_PASSES || round->n_blocked == IMAGES_ROUND_BLOCKED)
        round->closed = true; /* its turn: the room freed from now on is its own */
    else if (!round->closed)
        round->blocked[round->n_blocked++] = q;
}

images_progress images_advance(router *rt, router_request *q, images_round *round, uint64_t now,
                               vlmd_error *err, uint32_t *error_image)
{
    *error_image = 0;
    if (now > q->deadline_ms && !q->n_held) {
        vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the images waited %lld ms (--image-wait-ms) for "
                    "room in the embedding arena: %.1f of its %.1f MiB (--embed-arena-mb) are "
                    "held by other requests; try again", (long long)rt->cfg->image_wait_ms,
                    mib(embed_cache_held(&rt->embeds)), mib(rt->embeds.capacity));
        return IMAGES_FAILED;
    }
    if (now > q->deadline_ms) {
        vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the images waited %lld ms for the visual worker "
                    "(--image-wait-ms); try again", (long long)rt->cfg->image_wait_ms);
        return IMAGES_FAILED;
    }
    if (!q->n_held) {
        if (!router_ready_visual(rt)) {
            vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the visual worker is not ready");
            return IMAGES_FAILED;
        }
        if (round->closed || !take_room(rt, q)) {
            wait_for_room(rt, q, round);
            return IMAGES_WAITING; /* until requests holding images end */
        }
        for (size_t j = 0; j < round->n_blocked; j++)
            round->blocked[j]->room_passes++;
    }
    for (uint32_t i = 0; i < q->n_images; i++)
        if (embed_cache_find(&rt->embeds, q->hashes[i])->state != EMBED_READY)
            return IMAGES_WAITING;
    return IMAGES_READY;
}

void images_round_end(router *rt, const images_round *round, uint64_t now)
{
    if (!round->waiting || (rt->arena_logged_ms && now - rt->arena_logged_ms < IMAGES_ROOM_LOG_MS))
        return;
    rt->arena_logged_ms = now;
    const router_request *q = round->oldest;
    embed_want want[VLMD_PROTO_MAX_IMAGES];
    wants_of(rt, &q->submit->u.request_submit, want);
    uint64_t waited = now + (uint64_t)rt->cfg->image_wait_ms - q->deadline_ms;
    VLMD_WARN("%u request(s) wait for room in the embedding arena: %.1f of its %.1f MiB are held "
              "by requests or being encoded; the oldest waiting needs %.1f MiB and has waited "
              "%llu ms of --image-wait-ms %lld (a larger --embed-arena-mb holds more images at "
              "once)", round->waiting, mib(embed_cache_held(&rt->embeds)),
              mib(rt->embeds.capacity), mib(embed_cache_need(want, q->n_images)),
              (unsigned long long)waited, (long long)rt->cfg->image_wait_ms);
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
