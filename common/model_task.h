/* model_task.h - what a checkpoint serves: generation, embeddings or
 * reranking, decided from its files as published (or --task).
 *
 * An embedding checkpoint is a sentence-transformers one: modules.json names
 * a Transformer, a Pooling module (its config.json must say last-token
 * pooling, the one Qwen3-Embedding uses) and optionally Normalize. A
 * reranker (Qwen3-Reranker) is a plain causal LM: only its README (front
 * matter pipeline_tag text-ranking, or a heading naming a reranker) tells it
 * apart. Anything else generates (and, with --task generate+embed, embeds
 * too: llama.cpp's --embeddings). What vlmd cannot pool (mean, CLS, a Dense
 * module) is refused at start, naming what was found. */
#ifndef VLMD_MODEL_TASK_H
#define VLMD_MODEL_TASK_H

#include <stdbool.h>
#include <stdint.h>

#include "model_config.h"
#include "status.h"

typedef enum vlmd_task {
    VLMD_TASK_GENERATE = 0,     /* chat, completions, responses */
    VLMD_TASK_EMBED,            /* /v1/embeddings */
    VLMD_TASK_RERANK,           /* /v1/rerank, /v1/score */
} vlmd_task;

#define VLMD_MAX_MRL_DIMS 16

typedef struct vlmd_model_task {
    vlmd_task task;
    bool embed_too;             /* generate+embed: /v1/embeddings beside generation */
    bool normalize;             /* embed: vectors are L2-normalised (a Normalize module,
                                 * or --task embed on a model without modules.json) */
    bool matryoshka;            /* embed: `dimensions` may shorten a vector */
    int64_t mrl_dims[VLMD_MAX_MRL_DIMS]; /* the only dimensions allowed (none: any 1..hidden) */
    int n_mrl_dims;
    char source[160];           /* how it was decided, for the log */
} vlmd_model_task;

/* Decides model_dir's task: flag is --task (auto, generate, embed, rerank,
 * generate+embed);
 * config is its config.json as read. Refuses a sentence-transformers
 * pipeline vlmd cannot reproduce. */
vlmd_status vlmd_model_task_detect(const char *model_dir, const char *flag,
                                   const vlmd_model_config *config, vlmd_model_task *out,
                                   vlmd_error *err);

const char *vlmd_task_name(vlmd_task t);
/* Whether the model serves t (its task, or embeddings beside generation). */
bool vlmd_model_task_serves(const vlmd_model_task *m, vlmd_task t);

#endif
