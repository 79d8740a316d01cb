/* main.c - vlmd-visual: the visual (ViT) worker.
 *
 * Start-up: read the model's vision config, open the backend, load the vision
 * tower and run the stress-reserve (encoder.h: the workspace for the worst
 * case, every buffer kept, and the worst-case batch through the real tower
 * where only a run measures it), then report READY with the device bytes
 * held, which the router passes to the engine as the peer footprint.
 *
 * Serving: IMAGE_JOBs are planned from the header on the loop thread (a bad
 * header or a token count that disagrees with the requester's is answered at
 * once), queued, and encoded in batches on libuv's thread pool, one batch at
 * a time and never larger than the stress-tested one. Each image's
 * embeddings (and Qwen3-VL's DeepStack features after them) go straight into
 * the shared arena at the offset the router gave; an IMAGE_RESULT says when
 * they are there (or why not).
 *
 * Costly images (docs/SECURITY.md): requests share the queue in proportion
 * to the pixels their images make this worker decode and resize
 * (fair_queue.h), so one request's costly images do not hold back another's
 * cheap ones; a job that waited past --image-wait-ms, whose request the router has
 * failed by then, is dropped unencoded; and the threads that decode and
 * encode run at --visual-nice, so they yield the CPU to the engine's steps. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend.h"
#include "buf.h"
#include "clock.h"
#include "fair_queue.h"
#include "host_memory.h"
#include "encoder.h"
#include "log.h"
#include "process.h"
#include "service.h"
#include "shm_arena.h"

typedef struct job {
    uint64_t req_id;
    uint32_t image_index;
    uint8_t hash[32];
    uint8_t *data;              /* owned */
    uint32_t n_data;
    uint64_t arena_offset;
    uint32_t tokens;
    uint64_t cost;              /* pixels decoded and resized (image_encoder_plan_cost) */
    uint64_t arrived_ms;
} job;

typedef struct visual_worker {
    vlmd_service svc;
    vlmd_backend *backend;
    image_encoder *enc;         /* NULL for a model without a vision tower */
    vlmd_shm_arena arena;       /* mapped at the first job */
    fair_queue queue;           /* waiting jobs (owned job *), requests taking turns */
    job *batch;                 /* the batch on the pool: [batch_images] */
    encode_item *items;
    int n_batch;
    uv_work_t work;
    bool busy, stopping;
    uint64_t allocs_at_ready;   /* the device allocator's count when READY was sent */
    uint64_t encoded, failed;   /* images */
    uint64_t shed;              /* jobs dropped unencoded past --image-wait-ms */
} visual_worker;

static void send_result(visual_worker *w, const job *j, vlmd_status st, const char *message)
{
    if (w->stopping)
        return;
    vlmd_msg m = {.type = VLMD_MSG_IMAGE_RESULT};
    m.u.image_result = (vlmd_msg_image_result){
        .req_id = j->req_id, .image_index = j->image_index, .status = st,
        .message = (char *)message,
        .image = {.token_count = j->tokens, .arena_offset = j->arena_offset},
        .embed_bytes = st == VLMD_OK ? j->tokens * vlmd_image_token_bytes(&w->svc.model) : 0};
    memcpy(m.u.image_result.image.hash, j->hash, 32);
    vlmd_peer_send(w->svc.peer, &m);
}

static void publish_counters(visual_worker *w)
{
    if (w->stopping)
        return;
    vlmd_peer_set_counter(w->svc.peer, "images_encoded", w->encoded);
    vlmd_peer_set_counter(w->svc.peer, "images_failed", w->failed);
    vlmd_peer_set_counter(w->svc.peer, "images_shed", w->shed);
    vlmd_peer_set_counter(w->svc.peer, "device_allocations_since_ready",
                          vlmd_backend_alloc_count(w->backend) - w->allocs_at_ready);
}

/* ---- batches on the pool ----------------------------------------------------------- */

static void on_batch_work(uv_work_t *req)
{
    visual_worker *w = req->data;
    image_encoder_run(w->enc, w->items, w->n_batch);
}

static void start_batch(visual_worker *w);

static void on_batch_done(uv_work_t *req, int status)
{
    visual_worker *w = req->data;
    w->busy = false;
    for (int i = 0; i < w->n_batch; i++) {
        encode_item *it = &w->items[i];
        if (status != 0)
            it->status = vlmd_errorf(&it->err, VLMD_ERR_INTERNAL, "the batch was not run");
        if (it->status != VLMD_OK)
            VLMD_REQ_WARN(w->batch[i].req_id, "image %u: %s", w->batch[i].image_index,
                          it->err.msg);
        send_result(w, &w->batch[i], it->status, it->status == VLMD_OK ? "" : it->err.msg);
        free(w->batch[i].data);
        *(it->status == VLMD_OK ? &w->encoded : &w->failed) += 1;
    }
    w->n_batch = 0;
    start_batch(w);
    publish_counters(w);
}

/* Drops the jobs that waited past --image-wait-ms: the router counts that
 * wait from the request's arrival, before the job was sent, so their request
 * has failed already. (A later request for the same image, if one waits for
 * it, fails with them and may be sent again.) Oldest first: they are a prefix. */
static void shed_stale(visual_worker *w, uint64_t now)
{
    uint64_t wait = (uint64_t)w->svc.cfg.image_wait_ms;
    job *j;
    while ((j = fair_queue_oldest(&w->queue)) && now - j->arrived_ms > wait) {
        fair_queue_pop_oldest(&w->queue);
        char why[200];
        snprintf(why, sizeof why, "it waited %llu ms in the visual worker's queue behind other "
                 "requests' images, past --image-wait-ms; try again",
                 (unsigned long long)(now - j->arrived_ms));
        send_result(w, j, VLMD_ERR_UNAVAILABLE, why);
        w->shed++;
        free(j->data);
        free(j);
    }
}

/* Takes the next jobs in fair order into a batch. Each image has at most the
 * largest image's tokens, so a batch of the stress-tested count always fits
 * the reserved tokens. */
static void start_batch(visual_worker *w)
{
    if (w->busy || w->stopping || !fair_queue_len(&w->queue))
        return;
    shed_stale(w, vlmd_now_ms());
    uint32_t max_images = image_encoder_batch_images(w->enc);
    size_t n = 0;
    job *next;
    while (n < max_images && (next = fair_queue_pop(&w->queue))) {
        job *j = &w->batch[n];
        *j = *next;
        free(next);
        w->items[n++] = (encode_item){j->data, j->n_data, j->tokens,
                                      (float *)((char *)w->arena.base + j->arena_offset)};
    }
    if (!n)
        return;
    w->n_batch = (int)n;
    w->busy = true;
    w->work.data = w;
    uv_queue_work(&w->svc.loop, &w->work, on_batch_work, on_batch_done);
}

/* ---- jobs -------------------------------------------------------------------------- */

/* Checks a job on the loop thread; returns false (after answering) when it
 * cannot be encoded. */
static bool accept_job(visual_worker *w, const vlmd_msg_image_job *m, job *j)
{
    char why[600];
    vlmd_error err = {0};
    *j = (job){.req_id = m->req_id, .image_index = m->image_index, .n_data = m->n_data,
               .arena_offset = m->arena_offset, .tokens = m->token_count,
               .arrived_ms = vlmd_now_ms()};
    memcpy(j->hash, m->hash, 32);
    if (!w->enc) {
        send_result(w, j, VLMD_ERR_INVALID_ARG, "this model has no vision tower");
        return false;
    }
    uint32_t tokens = 0;
    vlmd_status st = image_encoder_plan_cost(w->enc, m->data, m->n_data, &tokens, &j->cost, &err);
    if (st != VLMD_OK) {
        send_result(w, j, st, err.msg);
        return false;
    }
    if (tokens != m->token_count) {
        snprintf(why, sizeof why, "the requester counted %u image tokens, this worker %u (do "
                 "--vision-min-pixels and --vision-max-pixels agree?)", m->token_count, tokens);
        send_result(w, j, VLMD_ERR_INTERNAL, why);
        return false;
    }
    if (!w->arena.base &&
        vlmd_shm_arena_open(w->svc.cfg.embed_arena_path, true, &w->arena, &err) != VLMD_OK) {
        send_result(w, j, VLMD_ERR_UNAVAILABLE, err.msg);
        return false;
    }
    uint64_t bytes = tokens * vlmd_image_token_bytes(&w->svc.model);
    if (m->arena_offset % sizeof(float) ||
        !vlmd_shm_arena_holds(&w->arena, m->arena_offset, bytes)) {
        snprintf(why, sizeof why, "offset %llu + %llu bytes is outside the embedding arena",
                 (unsigned long long)m->arena_offset, (unsigned long long)bytes);
        send_result(w, j, VLMD_ERR_INTERNAL, why);
        return false;
    }
    j->data = malloc(m->n_data ? m->n_data : 1);
    if (!j->data) {
        send_result(w, j, VLMD_ERR_NOMEM, "the visual worker is out of memory");
        return false;
    }
    memcpy(j->data, m->data, m->n_data);
    return true;
}

static void on_job(visual_worker *w, const vlmd_msg_image_job *m)
{
    job j;
    if (!accept_job(w, m, &j))
        return;
    job *queued = malloc(sizeof *queued);
    if (!queued || fair_queue_push(&w->queue, j.req_id, j.cost, queued, NULL) != VLMD_OK) {
        send_result(w, &j, VLMD_ERR_NOMEM, "the visual worker is out of memory");
        free(j.data);
        free(queued);
        return;
    }
    *queued = j;
    start_batch(w);
}

static void on_message(vlmd_service *svc, vlmd_msg *msg, void *ud)
{
    (void)svc;
    visual_worker *w = ud;
    if (msg->type == VLMD_MSG_IMAGE_JOB)
        on_job(w, &msg->u.image_job);
    else if (msg->type != VLMD_MSG_WELCOME)
        VLMD_WARN("ignored an unexpected %s message", vlmd_msg_type_str(msg->type));
}

static void on_stop(vlmd_service *svc, void *ud)
{
    (void)svc;
    visual_worker *w = ud;
    w->stopping = true; /* a batch in flight finishes; nothing more leaves */
}

/* ---- start-up ---------------------------------------------------------------------- */

/* Loads the tower and runs the stress-reserve; a model or limits that cannot
 * work are a configuration error (exit 2: restarting cannot help). */
static void reserve(visual_worker *w)
{
    const vlmd_config *cfg = &w->svc.cfg;
    const vlmd_model_config *m = &w->svc.model;
    vlmd_error err = {0};
    if (!m->has_vision) {
        VLMD_INFO("%s has no vision tower: this worker reserves nothing", m->architecture);
        return;
    }
    if (!cfg->embed_arena_path[0]) {
        VLMD_ERROR("--embed-arena-path is required for a model with images (the launcher sets it)");
        exit(VLMD_EXIT_CONFIG);
    }
    vlmd_vision_params params;
    vlmd_safetensors *st = NULL;
    encoder_config ec = {(uint32_t)cfg->visual_batch_size, (uint64_t)cfg->max_image_pixels,
                         ENCODER_STRESS_AUTO};
    if (vlmd_vision_params_configure(cfg->model, cfg->vision_min_pixels, cfg->vision_max_pixels,
                                     &params, &err) != VLMD_OK ||
        vlmd_safetensors_open_dir(cfg->model, &st, &err) != VLMD_OK ||
        image_encoder_create(w->backend, m, st, &params, &ec, &w->enc, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    vlmd_safetensors_close(st);
    fair_queue_init(&w->queue);
    w->batch = calloc(ec.batch_images, sizeof *w->batch);
    w->items = calloc(ec.batch_images, sizeof *w->items);
    if (!w->batch || !w->items)
        VLMD_FATAL("out of memory");
    VLMD_INFO("%s vision tower: depth %lld, width %lld; %u images of up to %u tokens per batch; "
              "%llu MiB reserved on %s",
              m->architecture, (long long)m->vision.depth, (long long)m->vision.embed_dim,
              ec.batch_images, image_encoder_batch_tokens(w->enc) / ec.batch_images,
              (unsigned long long)(vlmd_backend_allocated_bytes(w->backend) >> 20),
              vlmd_backend_info(w->backend)->name);
}

/* Lowers this thread's priority to --visual-nice before the backend's pool and
 * libuv's are started, so that every thread that decodes or encodes inherits
 * it (on Linux a nice value is per thread). */
static void lower_priority(const vlmd_config *cfg)
{
    if (cfg->visual_nice && setpriority(PRIO_PROCESS, 0, (int)cfg->visual_nice) != 0)
        VLMD_WARN("--visual-nice %lld: %s", (long long)cfg->visual_nice, strerror(errno));
}

int main(int argc, char **argv)
{
    visual_worker w = {0};
    vlmd_service_init(&w.svc, VLMD_ROLE_VISUAL, argc, argv);
    lower_priority(&w.svc.cfg);
    vlmd_error err = {0};
    vlmd_backend_options opts = vlmd_backend_options_of(&w.svc.cfg);
    if (vlmd_backend_open(&opts, &w.backend, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    if (vlmd_backend_info(w.backend)->kind == VLMD_DEVICE_CPU)
        vlmd_backend_limit(w.backend, vlmd_cpu_device_bytes(w.svc.cfg.cpu_device_mb));
    if (vlmd_backend_set_threads(w.backend, (int)w.svc.cfg.threads, &err) != VLMD_OK)
        VLMD_FATAL("--threads %lld: %s", (long long)w.svc.cfg.threads, err.msg);
    reserve(&w);
    vlmd_service_start(&w.svc, on_message, on_stop, &w);
    /* device and memory are borrowed for the call (set_ready copies them) */
    char values[4][24];
    snprintf(values[0], sizeof values[0], "%llu",
             (unsigned long long)vlmd_backend_allocated_bytes(w.backend));
    snprintf(values[1], sizeof values[1], "%u", w.enc ? image_encoder_batch_images(w.enc) : 0);
    snprintf(values[2], sizeof values[2], "%u", w.enc ? image_encoder_batch_tokens(w.enc) : 0);
    vlmd_strlcpy(values[3], w.enc ? encoder_stress_str(image_encoder_stressed(w.enc)) : "none",
                 sizeof values[3]);
    vlmd_kv memory[4] = {{"reserved_bytes", values[0]}, {"batch_images", values[1]},
                         {"batch_tokens", values[2]}, {"stress", values[3]}};
    vlmd_msg_ready ready = {.reserved_bytes = vlmd_backend_allocated_bytes(w.backend),
                            .device = (char *)vlmd_backend_info(w.backend)->name,
                            .memory = memory, .n_memory = 4};
    w.allocs_at_ready = vlmd_backend_alloc_count(w.backend);
    vlmd_peer_set_counter(w.svc.peer, "device_allocations_since_ready", 0);
    vlmd_peer_set_ready(w.svc.peer, &ready);
    int rc = vlmd_service_run(&w.svc); /* returns after a batch in flight is done */
    for (job *j; (j = fair_queue_pop_oldest(&w.queue));) {
        free(j->data);
        free(j);
    }
    fair_queue_free(&w.queue);
    free(w.batch);
    free(w.items);
    image_encoder_free(w.enc);
    vlmd_shm_arena_close(&w.arena);
    vlmd_backend_destroy(w.backend);
    return rc;
}
