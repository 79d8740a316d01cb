/* grammar_jobs.c - grammars compiled on the thread pool (see grammar_jobs.h). */
#include "grammar_jobs.h"

#include <stdlib.h>

#include "log.h"

struct grammar_job {
    uv_work_t work;
    grammar_jobs *owner;
    vlmd_msg submit;            /* taken */
    vlmd_grammar *g;            /* the result (NULL: failed, err says why) */
    vlmd_error err;
    bool cancelled;
    grammar_job *prev, *next;
};

void grammar_jobs_init(grammar_jobs *j, uv_loop_t *loop, grammar_job_done done, void *ud)
{
    *j = (grammar_jobs){.loop = loop, .done = done, .ud = ud};
}

static void on_compile(uv_work_t *w)
{
    grammar_job *job = w->data;
    const vlmd_request_grammar *gr = &job->submit.u.request_submit.grammar;
    /* touches nothing shared: the text is the job's, the compiler keeps no state */
    vlmd_grammar_compile_text(vlmd_grammar_kind_str((vlmd_grammar_kind)gr->kind), gr->text,
                              gr->n_text, &job->g, &job->err);
}

static void on_compiled(uv_work_t *w, int status)
{
    grammar_job *job = w->data;
    grammar_jobs *j = job->owner;
    if (job->prev)
        job->prev->next = job->next;
    else
        j->head = job->next;
    if (job->next)
        job->next->prev = job->prev;
    j->n--;
    if (status != 0 && !job->g)
        vlmd_errorf(&job->err, VLMD_ERR_UNAVAILABLE, "the grammar's compile did not run");
    if (job->cancelled)
        vlmd_grammar_free(job->g);
    else
        j->done(&job->submit, job->g, &job->err, j->ud);
    vlmd_msg_free(&job->submit);
    free(job);
}

void grammar_jobs_start(grammar_jobs *j, vlmd_msg *submit)
{
    grammar_job *job = calloc(1, sizeof *job);
    if (!job)
        VLMD_FATAL("out of memory for a grammar's compile");
    job->owner = j;
    vlmd_msg_take(&job->submit, submit);
    job->work.data = job;
    job->next = j->head;
    if (j->head)
        j->head->prev = job;
    j->head = job;
    j->n++;
    uv_queue_work(j->loop, &job->work, on_compile, on_compiled);
}

bool grammar_jobs_cancel(grammar_jobs *j, uint64_t req_id)
{
    for (grammar_job *job = j->head; job; job = job->next)
        if (!job->cancelled && job->submit.u.request_submit.req_id == req_id) {
            job->cancelled = true;
            return true;
        }
    return false;
}

void grammar_jobs_cancel_all(grammar_jobs *j)
{
    for (grammar_job *job = j->head; job; job = job->next)
        job->cancelled = true;
}
