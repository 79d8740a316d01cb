/* main.c - vlmd-llm: the engine process.
 *
 * Start-up order (DESIGN.md §1): say hello, load the weights, ask the router
 * for the peer footprint (it answers once the visual worker has reserved its
 * memory), size the KV cache and create the engine, then publish READY with
 * the capacity; the frontend reports ready only after that. (The four-phase
 * auto-profile of DESIGN.md §4 replaces the fixed automatic size later.)
 *
 * Serving: REQUEST_SUBMIT joins the engine; while any request is active an
 * idle watcher runs one engine step per loop turn, so messages (new
 * requests, cancels) are handled between steps; each generated token leaves
 * as a TOKEN_CHUNK. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "engine.h"
#include "log.h"
#include "process.h"
#include "service.h"

#define AUTO_KV_TOKENS 16384

typedef struct llm_worker {
    vlmd_service svc;
    vlmd_backend *backend;
    qwen2_model *model;
    engine *engine;
    uv_idle_t stepper;
    bool stepping;
    bool profiled;
} llm_worker;

/* ---- engine output ----------------------------------------------------------- */

static void emit(uint64_t req_id, const int32_t *tokens, int32_t n, vlmd_finish_reason finish,
                 uint32_t prompt_tokens, uint32_t completion_tokens, void *ud)
{
    llm_worker *w = ud;
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){
        .req_id = req_id, .tokens = (uint32_t *)tokens, .n_tokens = (uint32_t)n,
        .finish = finish, .message = "", .prompt_tokens = prompt_tokens,
        .completion_tokens = completion_tokens};
    vlmd_peer_send(w->svc.peer, &m);
}

static void refuse(llm_worker *w, uint64_t req_id, vlmd_status st, const char *why)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = req_id, .finish = VLMD_FINISH_ERROR,
                                             .status = st, .message = (char *)why};
    vlmd_peer_send(w->svc.peer, &m);
}

static void on_step(uv_idle_t *h)
{
    llm_worker *w = h->data;
    bool worked = false;
    vlmd_error err = {0};
    if (engine_step(w->engine, &worked, &err) != VLMD_OK)
        VLMD_FATAL("engine step failed: %s", err.msg); /* a broken invariant, not a request's */
    vlmd_peer_set_kv_used(w->svc.peer, (uint64_t)(engine_capacity(w->engine) -
                                                  engine_free_slots(w->engine)));
    if (!worked && engine_active(w->engine) == 0) {
        uv_idle_stop(h);
        w->stepping = false;
    }
}

static void start_stepping(llm_worker *w)
{
    if (!w->stepping && engine_active(w->engine) > 0) {
        uv_idle_start(&w->stepper, on_step);
        w->stepping = true;
    }
}

/* ---- start-up ----------------------------------------------------------------- */

/* Sizes the KV cache and creates the engine once the peer footprint is known. */
static void llm_profile(llm_worker *w, uint64_t peer_bytes)
{
    const vlmd_config *cfg = &w->svc.cfg;
    const vlmd_text_config *t = &w->svc.model.text;
    int64_t max_len = cfg->max_model_len ? cfg->max_model_len : t->max_position_embeddings;
    int64_t slots = cfg->max_total_token_num;
    if (!slots)
        slots = max_len > AUTO_KV_TOKENS ? max_len : AUTO_KV_TOKENS;
    if (max_len > slots) {
        VLMD_ERROR("--max-model-len %lld does not fit a KV cache of %lld tokens "
                   "(--max-total-token-num); lower --max-model-len or raise the cache",
                   (long long)max_len, (long long)slots);
        exit(VLMD_EXIT_CONFIG);
    }
    engine_config ec = {
        .kv_slots = (int32_t)slots,
        .max_batch_tokens = (int32_t)cfg->batch_max_tokens,
        .max_running = (int32_t)cfg->max_num_seqs,
        .eos_id = (int32_t)t->eos_token_id,
        .max_model_len = (int32_t)max_len,
    };
    vlmd_error err = {0};
    if (engine_create(w->model, &ec, emit, w, &w->engine, &err) != VLMD_OK)
        VLMD_FATAL("cannot create the engine: %s", err.msg);
    uv_idle_init(&w->svc.loop, &w->stepper);
    w->stepper.data = w;
    uint64_t free_bytes = 0, total_bytes = 0;
    vlmd_backend_mem_info(w->backend, &free_bytes, &total_bytes, NULL);
    VLMD_INFO("KV cache: %lld tokens (%llu MiB), %lld per step, %lld sequences, max length %lld; "
              "device %s: %llu MiB free of %llu, peers reserve %llu MiB",
              (long long)slots,
              (unsigned long long)((uint64_t)slots * qwen2_kv_bytes_per_token(w->model) >> 20),
              (long long)ec.max_batch_tokens, (long long)ec.max_running, (long long)max_len,
              vlmd_backend_info(w->backend)->name, (unsigned long long)(free_bytes >> 20),
              (unsigned long long)(total_bytes >> 20), (unsigned long long)(peer_bytes >> 20));
    w->profiled = true;
    vlmd_msg_ready ready = {.kv_capacity_tokens = (uint64_t)slots,
                            .device = (char *)vlmd_backend_info(w->backend)->name};
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
    case VLMD_MSG_REQUEST_SUBMIT: {
        vlmd_error err = {0};
        if (!w->engine) {
            refuse(w, msg->u.request_submit.req_id, VLMD_ERR_UNAVAILABLE, "not ready");
        } else if (engine_submit(w->engine, &msg->u.request_submit, &err) != VLMD_OK) {
            VLMD_REQ_WARN(msg->u.request_submit.req_id, "refused: %s", err.msg);
            refuse(w, msg->u.request_submit.req_id, err.status, err.msg);
        } else {
            start_stepping(w);
        }
        break;
    }
    case VLMD_MSG_REQUEST_CANCEL:
        if (w->engine && engine_cancel(w->engine, msg->u.request_cancel.req_id))
            vlmd_peer_set_kv_used(w->svc.peer, (uint64_t)(engine_capacity(w->engine) -
                                                          engine_free_slots(w->engine)));
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
    if (w->engine)
        uv_close((uv_handle_t *)&w->stepper, NULL);
    engine_free(w->engine);
    qwen2_free(w->model);
    vlmd_backend_destroy(w->backend);
    w->engine = NULL;
    w->model = NULL;
    w->backend = NULL;
}

/* Loads the weights before the process says it is ready; a model that
 * cannot load is a configuration error (exit 2: restarting cannot help). */
static void load_model(llm_worker *w)
{
    vlmd_error err = {0};
    if (vlmd_backend_create(w->svc.cfg.device, &w->backend, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    if (!vlmd_backend_ops(w->backend)) {
        if (strcmp(w->svc.cfg.device, "auto") != 0) {
            VLMD_ERROR("--device %s: the %s backend cannot run models yet; use --device cpu or "
                       "auto", w->svc.cfg.device, vlmd_backend_info(w->backend)->name);
            exit(VLMD_EXIT_CONFIG);
        }
        VLMD_WARN("the %s backend cannot run models yet; the engine runs on the CPU",
                  vlmd_backend_info(w->backend)->name);
        vlmd_backend_destroy(w->backend);
        if (vlmd_backend_create("cpu", &w->backend, &err) != VLMD_OK)
            VLMD_FATAL("%s", err.msg);
    }
    uint64_t t0 = vlmd_now_ms();
    vlmd_safetensors *st = NULL;
    if (vlmd_safetensors_open_dir(w->svc.cfg.model, &st, &err) != VLMD_OK ||
        qwen2_load(w->backend, &w->svc.model, st, &w->model, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    vlmd_safetensors_close(st);
    const vlmd_text_config *t = &w->svc.model.text;
    VLMD_INFO("%s loaded in %llu ms: %lld layers, hidden %lld, %lld heads (%lld KV), vocab %lld, "
              "%llu MiB of weights on %s",
              w->svc.model.architecture, (unsigned long long)(vlmd_now_ms() - t0),
              (long long)t->num_layers, (long long)t->hidden_size, (long long)t->num_heads,
              (long long)t->num_kv_heads, (long long)t->vocab_size,
              (unsigned long long)(vlmd_backend_allocated_bytes(w->backend) >> 20),
              vlmd_backend_info(w->backend)->name);
}

int main(int argc, char **argv)
{
    llm_worker w = {0};
    vlmd_service_init(&w.svc, VLMD_ROLE_LLM, argc, argv);
    load_model(&w);
    vlmd_service_start(&w.svc, on_message, on_stop, &w);
    return vlmd_service_run(&w.svc);
}
