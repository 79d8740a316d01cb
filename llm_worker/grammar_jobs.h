/* grammar_jobs.h - the engine process compiles a request's grammar on the
 * thread pool before the request reaches the engine, so a costly schema (up
 * to structured.h's work bound, about a second) stalls neither the loop (the
 * heartbeats, the socket) nor the steps of every running request; the engine
 * then finds it compiled (grammar_cache_adopt).
 *
 * A job owns its REQUEST_SUBMIT from start to done; a cancel of a request
 * still compiling drops it there (its done never runs). Loop thread only,
 * but for the compile itself. */
#ifndef VLMD_GRAMMAR_JOBS_H
#define VLMD_GRAMMAR_JOBS_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "proto.h"
#include "structured.h"

/* A job's end on the loop thread: g compiled from submit's grammar (owned by
 * the callee), or NULL with err saying why. submit is lent. */
typedef void (*grammar_job_done)(vlmd_msg *submit, vlmd_grammar *g, const vlmd_error *err,
                                 void *ud);

typedef struct grammar_job grammar_job;
typedef struct grammar_jobs {
    uv_loop_t *loop;
    grammar_job_done done;
    void *ud;
    grammar_job *head;          /* the jobs in flight */
    uint32_t n;
} grammar_jobs;

void grammar_jobs_init(grammar_jobs *j, uv_loop_t *loop, grammar_job_done done, void *ud);

/* Compiles submit's grammar (it has one) off the loop; takes the message
 * (vlmd_msg_take). */
void grammar_jobs_start(grammar_jobs *j, vlmd_msg *submit);

/* True when req_id was compiling: it is dropped, its done will not run. */
bool grammar_jobs_cancel(grammar_jobs *j, uint64_t req_id);

/* Drops every job in flight (their requests are nobody's any more). */
void grammar_jobs_cancel_all(grammar_jobs *j);

#endif
