/* test_fair_queue.c - the visual worker's queue of image jobs: a request's
 * cheap image is served before another request's costly images queued ahead
 * of it; requests share the work by cost, each its own jobs in order; a
 * costly image is not starved by a stream of cheap ones (it gets its share); the oldest job can
 * be dropped unserved. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "fair_queue.h"

/* Items are small integers carried in the pointer. */
#define ITEM(k) ((void *)(uintptr_t)(k))
#define KEY(p) ((int)(uintptr_t)(p))

#define BIG 26000000ull    /* a 5000x5000 image resized to about a megapixel */
#define SMALL 200000ull    /* a 300x300 one */

static void push(fair_queue *q, uint64_t flow, uint64_t cost, int item)
{
    cr_assert_eq(fair_queue_push(q, flow, cost, ITEM(item), NULL), VLMD_OK);
}

Test(fair_queue, a_cheap_image_passes_the_costly_ones_queued_before_it)
{
    fair_queue q;
    fair_queue_init(&q);
    /* ten requests of three costly images each (items 100 * request + image) */
    for (int r = 1; r <= 10; r++)
        for (int i = 0; i < 3; i++)
            push(&q, (uint64_t)r, BIG, 100 * r + i);
    cr_expect_eq(KEY(fair_queue_pop(&q)), 100, "one is being encoded when the cheap one comes");
    push(&q, 99, SMALL, 1);
    cr_expect_eq(KEY(fair_queue_pop(&q)), 1, "under FIFO it would wait for 29 costly images");
    /* then every costly request's first image before any request's second */
    for (int r = 2; r <= 10; r++)
        cr_expect_eq(KEY(fair_queue_pop(&q)), 100 * r);
    cr_expect_eq(KEY(fair_queue_pop(&q)), 101);
    fair_queue_free(&q);
}

Test(fair_queue, requests_share_by_cost_and_each_keeps_its_order)
{
    fair_queue q;
    fair_queue_init(&q);
    /* request 1: 40 images of cost 10; request 2: 10 images of cost 40 */
    for (int i = 0; i < 40; i++)
        push(&q, 1, 10, 1000 + i);
    for (int i = 0; i < 10; i++)
        push(&q, 2, 40, 2000 + i);
    int next[3] = {0, 1000, 2000};
    uint64_t work[3] = {0};
    for (int n = 0; n < 50; n++) {
        int k = KEY(fair_queue_pop(&q));
        int r = k / 1000;
        cr_assert_eq(k, next[r], "request %d's images in order", r);
        next[r]++;
        work[r] += r == 1 ? 10 : 40;
        if (n < 40) /* while both have images, neither is more than one image ahead */
            cr_expect_leq(work[1] > work[2] ? work[1] - work[2] : work[2] - work[1], 40,
                          "after %d jobs: %llu and %llu", n + 1, (unsigned long long)work[1],
                          (unsigned long long)work[2]);
    }
    cr_expect_null(fair_queue_pop(&q));
    cr_expect_eq(q.n_flows, 0, "flows are forgotten with their last job");
    fair_queue_free(&q);
}

Test(fair_queue, a_costly_image_is_not_starved_by_a_stream_of_cheap_requests)
{
    fair_queue q;
    fair_queue_init(&q);
    push(&q, 1, BIG, 1);
    int served_after = -1;
    for (int i = 0; i < 3; i++)
        push(&q, 1000 + (uint64_t)i, SMALL, 2);
    for (int n = 0; n < 100000 && served_after < 0; n++) {
        /* a new cheap request arrives as each image is served: four requests wait */
        push(&q, 2000 + (uint64_t)n, SMALL, 2);
        if (KEY(fair_queue_pop(&q)) == 1)
            served_after = n;
    }
    cr_assert_geq(served_after, 0, "the costly image was never served");
    /* its share of the worker, beside four others: a fifth, so it is served once about
     * four times its cost went to the others (the virtual clock's estimate: 5 times) */
    cr_expect_leq((uint64_t)served_after * SMALL, 6 * BIG, "served after %d cheap images",
                  served_after);
    cr_expect_geq((uint64_t)served_after * SMALL, 3 * BIG, "served after %d cheap images",
                  served_after);
    while (fair_queue_pop(&q))
        ;
    fair_queue_free(&q);
}

Test(fair_queue, the_oldest_job_can_be_dropped_unserved)
{
    fair_queue q;
    fair_queue_init(&q);
    push(&q, 1, BIG, 1);
    push(&q, 2, SMALL, 2);
    push(&q, 1, BIG, 3);
    cr_expect_eq(KEY(fair_queue_oldest(&q)), 1);
    cr_expect_eq(KEY(fair_queue_pop_oldest(&q)), 1);
    cr_expect_eq(fair_queue_len(&q), 2);
    cr_expect_eq(KEY(fair_queue_pop(&q)), 2);
    cr_expect_eq(KEY(fair_queue_pop(&q)), 3, "request 1's next image is still queued");
    cr_expect_null(fair_queue_oldest(&q));
    cr_expect_null(fair_queue_pop_oldest(&q));
    fair_queue_free(&q);
}
