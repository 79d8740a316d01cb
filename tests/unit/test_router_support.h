/* test_router_support.h - what the router's tests share: running their one
 * libuv loop for a while or until a count is reached, and the visual
 * worker's answer to an image job (they play the router's peers). */
#ifndef VLMD_TEST_ROUTER_SUPPORT_H
#define VLMD_TEST_ROUTER_SUPPORT_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "clock.h"
#include "peer.h"

/* Runs the loop for ms milliseconds. */
static inline void test_loop_pump(uv_loop_t *loop, int ms)
{
    uint64_t until = vlmd_now_ms() + (uint64_t)ms;
    while (vlmd_now_ms() < until) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

/* Runs the loop until *counter >= at_least or 2 s pass; says whether it was reached. */
static inline bool test_loop_wait(uv_loop_t *loop, const int *counter, int at_least)
{
    uint64_t deadline = vlmd_now_ms() + 2000;
    while (*counter < at_least && vlmd_now_ms() < deadline) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(500);
    }
    return *counter >= at_least;
}

/* The visual worker's IMAGE_RESULT for job j: status st (message: why it failed). */
static inline void test_answer_job(vlmd_peer *visual, const vlmd_msg_image_job *j,
                                   vlmd_status st, const char *message)
{
    vlmd_msg m = {.type = VLMD_MSG_IMAGE_RESULT};
    m.u.image_result = (vlmd_msg_image_result){.req_id = j->req_id, .image_index = j->image_index,
                                               .status = st, .message = (char *)message,
                                               .image = {.token_count = j->token_count,
                                                         .arena_offset = j->arena_offset}};
    memcpy(m.u.image_result.image.hash, j->hash, 32);
    cr_assert_eq(vlmd_peer_send(visual, &m), VLMD_OK);
}

#endif
