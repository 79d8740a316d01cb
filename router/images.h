/* images.h - the router's image stage (images.c): the arena's room for each
 * image of a request, and the jobs that have the visual worker encode them.
 * It reports how a request stands; requests.c (its only caller besides
 * router.c's start-up) decides what follows: queueing, or failing it. */
#ifndef VLMD_IMAGES_H
#define VLMD_IMAGES_H

#include "router_ctx.h"

typedef enum images_progress {
    IMAGES_WAITING,             /* for room in the arena or for the visual worker */
    IMAGES_READY,               /* every image is in the arena */
    IMAGES_FAILED,              /* the request must fail: err and error_image say why */
} images_progress;

/* Creates the arena when the model has a vision tower (nothing otherwise). */
vlmd_status images_start(router *rt, vlmd_error *err);
/* Takes a submit with images for q: on VLMD_OK its content is moved out of
 * msg into q and q waits in STAGE_IMAGES; on failure msg and q are untouched. */
vlmd_status images_submit(router *rt, router_request *q, vlmd_msg *msg, vlmd_error *err);
/* Gives back the arena references q holds (before q is removed). */
void images_release(router *rt, router_request *q);
/* A request waiting for arena room is passed by later ones that find room at
 * most this often; then no later request takes room until it has found its
 * own, so one that needs much of the arena gets its turn as the others end. */
#define IMAGES_MAX_ROOM_PASSES 16
/* Requests passed over in one round; past them the round is closed too. */
#define IMAGES_ROUND_BLOCKED 32
/* The log line that says requests wait for arena room comes at most this often. */
#define IMAGES_ROOM_LOG_MS 10000

/* One pass over the requests waiting for images, in arrival order (the
 * caller's): who found no room, and whether the room left is closed to the
 * requests after them. Start zeroed; end with images_round_end. */
typedef struct images_round {
    router_request *blocked[IMAGES_ROUND_BLOCKED]; /* found no room, oldest first (borrowed) */
    size_t n_blocked;
    bool closed;                /* an older request's turn: no one else takes room */
    uint32_t waiting;           /* requests that wait for room */
    const router_request *oldest; /* the oldest of them (borrowed) */
} images_round;

/* Moves q, waiting for its images, on as far as it can: room in the arena
 * for all of its images at once (or none: it holds nothing while it waits),
 * jobs for new images. Call for each waiting request in arrival order with
 * the round. IMAGES_FAILED (past its deadline at now, images larger than the
 * arena, no visual worker): err is filled and *error_image is the image's
 * index + 1, or 0 when no one image is to blame. */
images_progress images_advance(router *rt, router_request *q, images_round *round, uint64_t now,
                               vlmd_error *err, uint32_t *error_image);
/* Ends a round: says in the log (at most every IMAGES_ROOM_LOG_MS) that
 * requests wait for room in the arena, with its numbers. */
void images_round_end(router *rt, const images_round *round, uint64_t now);
/* Books an IMAGE_RESULT. Returns VLMD_OK, or, when the image failed (its
 * room is dropped), the status with which each request holding it fails. */
vlmd_status images_result(router *rt, const vlmd_msg_image_result *m);
/* The index among the images q holds of the one with this hash, or -1. */
int images_held_index(const router_request *q, const uint8_t hash[32]);
/* The visual worker went away: the rooms it was writing are dropped. The
 * requests waiting for images are the caller's to fail first. */
void images_visual_down(router *rt);

#endif
