/* prepare.c - a request's own work on the thread pool (see prepare.h).
 *
 * A job lives from prepare_start until its after-work callback on the loop.
 * Its request may be disposed meanwhile: a hook in the request's pool points
 * at the job and clears job->req when the pool goes; the job clears the
 * hook's pointer when it ends first. Both run on the loop thread. */
#include "prepare.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "api_request.h"
#include "h2o_include.h"
#include "log.h"
#include "response.h"

typedef struct prepare_hook {
    prepare_job *job;           /* NULL once the job ended */
} prepare_hook;

struct prepare_job {
    uv_work_t work;
    preparer *owner;
    h2o_req_t *req;             /* NULL once its client went away */
    prepare_hook *hook;         /* in req's pool while req lives */
    char *body;                 /* owned copy: req's memory may go while the pool reads */
    size_t len;
    bool heavy;
    const prepare_ops *ops;
    void *arg;                  /* owned: ops->free */
    bool ok;
    api_error err;
    prepare_job *next;          /* waiting for a heavy slot */
};

void preparer_init(preparer *p, uv_loop_t *loop)
{
    memset(p, 0, sizeof *p);
    p->loop = loop;
}

size_t preparer_pending(const preparer *p)
{
    return p->running + p->n_waiting;
}

size_t prepare_json_containers(const char *text, size_t len)
{
    size_t n = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (in_string) {
            if (ch == '\\')
                i++; /* the escaped character is never a quote that ends it */
            else if (ch == '"')
                in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '{' || ch == '[') {
            n++;
        }
    }
    return n;
}

static void on_dispose(void *p)
{
    prepare_hook *h = p;
    if (h->job)
        h->job->req = NULL;
}

static void on_work(uv_work_t *w)
{
    prepare_job *j = w->data;
    json_error_t jerr;
    json_t *body = NULL;
    if (prepare_json_containers(j->body, j->len) > PREPARE_MAX_CONTAINERS)
        j->ok = api_fail(&j->err, VLMD_ERR_INVALID_ARG, NULL, "invalid_json", "the body holds "
                         "more than %d JSON objects and arrays", PREPARE_MAX_CONTAINERS);
    else if (!(body = json_loadb(j->body, j->len, API_JSON_FLAGS, &jerr)))
        j->ok = api_fail(&j->err, VLMD_ERR_INVALID_ARG, NULL, "invalid_json",
                         "the body is not valid JSON: %s", jerr.text);
    else if (!json_is_object(body))
        j->ok = api_fail(&j->err, VLMD_ERR_INVALID_ARG, NULL, "invalid_json",
                         "the body must be a JSON object");
    else
        j->ok = j->ops->work(j->arg, body, &j->err);
    json_decref(body);
    free(j->body);
    j->body = NULL;
    if (j->heavy)
        malloc_trim(0); /* a big body's parse leaves hundreds of MB free but held */
}

static void run_next(preparer *p);

static void on_done(uv_work_t *w, int status)
{
    prepare_job *j = w->data;
    preparer *p = j->owner;
    p->running--;
    if (j->heavy)
        p->heavy_running--;
    if (j->req) {
        j->hook->job = NULL;
        if (status != 0)
            api_fail(&j->err, VLMD_ERR_INTERNAL, NULL, NULL, "the request could not be prepared");
        if (j->ok && status == 0)
            j->ops->done(j->req, j->arg);
        else
            vlmd_send_api_failure(j->req, &j->err);
    }
    j->ops->free(j->arg);
    free(j->body);
    free(j);
    run_next(p);
}

static void queue(preparer *p, prepare_job *j)
{
    p->running++;
    if (j->heavy)
        p->heavy_running++;
    j->work.data = j;
    if (uv_queue_work(p->loop, &j->work, on_work, on_done) != 0) {
        j->ok = api_fail(&j->err, VLMD_ERR_INTERNAL, NULL, NULL, "the thread pool refused work");
        on_done(&j->work, -1);
    }
}

/* Heavy jobs that waited, oldest first, while slots are free; those whose
 * client left meanwhile are dropped. */
static void run_next(preparer *p)
{
    while (p->waiting && p->heavy_running < PREPARE_HEAVY_SLOTS) {
        prepare_job *j = p->waiting;
        p->waiting = j->next;
        if (!p->waiting)
            p->waiting_tail = NULL;
        p->n_waiting--;
        if (j->req) {
            queue(p, j);
            continue;
        }
        j->ops->free(j->arg);
        free(j->body);
        free(j);
    }
}

void prepare_start(preparer *p, h2o_req_t *req, const prepare_ops *ops, void *arg)
{
    prepare_job *j = calloc(1, sizeof *j);
    char *body = j && req->entity.len ? malloc(req->entity.len) : NULL;
    if (!j || (req->entity.len && !body)) {
        free(j);
        ops->free(arg);
        api_error err;
        api_fail(&err, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &err);
        return;
    }
    if (body)
        memcpy(body, req->entity.base, req->entity.len);
    *j = (prepare_job){.owner = p, .req = req, .body = body, .len = req->entity.len,
                       .heavy = req->entity.len > PREPARE_HEAVY_BYTES, .ops = ops, .arg = arg};
    j->hook = h2o_mem_alloc_shared(&req->pool, sizeof *j->hook, on_dispose);
    j->hook->job = j;
    if (j->heavy)
        p->heavy_total++;
    if (j->heavy && p->heavy_running >= PREPARE_HEAVY_SLOTS) {
        if (p->waiting_tail)
            p->waiting_tail->next = j;
        else
            p->waiting = j;
        p->waiting_tail = j;
        p->n_waiting++;
        return;
    }
    queue(p, j);
}
