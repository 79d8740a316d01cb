/* model_task.c - a checkpoint's task from its published files (see model_task.h). */
#include "model_task.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

static const char *const task_names[] = {"generate", "embed", "rerank"};

const char *vlmd_task_name(vlmd_task t)
{
    return (unsigned)t < sizeof task_names / sizeof task_names[0] ? task_names[t] : "?";
}

bool vlmd_model_task_serves(const vlmd_model_task *m, vlmd_task t)
{
    return m->task == t || (m->embed_too && t == VLMD_TASK_EMBED);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* The Pooling module's config: last-token pooling only, the prompt included. */
static vlmd_status read_pooling(const char *model_dir, const char *path, vlmd_error *err)
{
    char file[4400];
    snprintf(file, sizeof file, "%s/%s/config.json", model_dir, path);
    json_error_t je;
    json_t *j = json_load_file(file, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s", file, je.text);
    }
    static const char *const others[] = {"pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                         "pooling_mode_max_tokens",
                                         "pooling_mode_mean_sqrt_len_tokens",
                                         "pooling_mode_weightedmean_tokens"};
    const char *found = NULL;
    for (size_t i = 0; i < sizeof others / sizeof others[0] && !found; i++)
        if (json_is_true(json_object_get(j, others[i])))
            found = others[i];
    bool last = json_is_true(json_object_get(j, "pooling_mode_lasttoken"));
    json_t *prompt = json_object_get(j, "include_prompt");
    bool without_prompt = json_is_false(prompt);
    json_decref(j);
    if (found || !last)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s; vlmd pools the last token only "
                           "(pooling_mode_lasttoken, as Qwen3-Embedding)", file,
                           found ? found : "no pooling mode set");
    if (without_prompt)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: include_prompt false is not supported",
                           file);
    return VLMD_OK;
}

/* modules.json's pipeline: Transformer, Pooling (last token), Normalize. */
static vlmd_status read_modules(const char *model_dir, json_t *modules, vlmd_model_task *out,
                                vlmd_error *err)
{
    bool pooled = false;
    size_t i;
    json_t *m;
    json_array_foreach(modules, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *path = json_string_value(json_object_get(m, "path"));
        if (!type)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s/modules.json: module %zu has no type",
                               model_dir, i);
        if (ends_with(type, ".Transformer"))
            continue;
        if (ends_with(type, ".Pooling")) {
            vlmd_status st = read_pooling(model_dir, path ? path : "", err);
            if (st != VLMD_OK)
                return st;
            pooled = true;
        } else if (ends_with(type, ".Normalize")) {
            out->normalize = true;
        } else {
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s/modules.json: module %s is not "
                               "supported (vlmd serves Transformer -> Pooling (last token) -> "
                               "Normalize)", model_dir, type);
        }
    }
    if (!pooled)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s/modules.json has no Pooling module",
                           model_dir);
    return VLMD_OK;
}

/* The README's front matter says pipeline_tag: text-ranking, or its first
 * heading names a reranker (Qwen3-Reranker's card: "# Qwen3-Reranker-0.6B"). */
static bool readme_says_reranker(const char *model_dir)
{
    char file[4200], line[512];
    snprintf(file, sizeof file, "%s/README.md", model_dir);
    FILE *f = fopen(file, "r");
    if (!f)
        return false;
    bool front = false, yes = false;
    for (int n = 0; !yes && n < 200 && fgets(line, sizeof line, f); n++) {
        if (n == 0 && strncmp(line, "---", 3) == 0) {
            front = true;
            continue;
        }
        if (front) {
            front = strncmp(line, "---", 3) != 0;
            yes = strncmp(line, "pipeline_tag:", 13) == 0 && strstr(line, "text-ranking");
            continue;
        }
        if (line[0] != '#')
            continue;
        for (char *p = line; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        yes = strstr(line, "reranker") != NULL;
        break;
    }
    fclose(f);
    return yes;
}

/* config.json's Matryoshka flags (vLLM's): is_matryoshka, matryoshka_dimensions. */
static void read_matryoshka(const char *model_dir, vlmd_model_task *out)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/config.json", model_dir);
    json_t *j = json_load_file(file, 0, NULL);
    json_t *dims = json_object_get(j, "matryoshka_dimensions");
    if (json_is_true(json_object_get(j, "is_matryoshka")))
        out->matryoshka = true;
    size_t i;
    json_t *d;
    json_array_foreach(dims, i, d) {
        if (json_is_integer(d) && out->n_mrl_dims < VLMD_MAX_MRL_DIMS) {
            out->mrl_dims[out->n_mrl_dims++] = json_integer_value(d);
            out->matryoshka = true;
        }
    }
    json_decref(j);
}

vlmd_status vlmd_model_task_detect(const char *model_dir, const char *flag,
                                   const vlmd_model_config *config, vlmd_model_task *out,
                                   vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    char file[4200];
    snprintf(file, sizeof file, "%s/modules.json", model_dir);
    json_error_t je;
    json_t *modules = json_load_file(file, 0, &je);
    if (!modules && access(file, F_OK) == 0)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s (line %d)", file, je.text, je.line);
    bool auto_task = !flag || !flag[0] || strcmp(flag, "auto") == 0;
    vlmd_status st = VLMD_OK;
    if (modules && (auto_task || strcmp(flag, "embed") == 0)) {
        out->task = VLMD_TASK_EMBED;
        snprintf(out->source, sizeof out->source, "modules.json: last-token pooling%s",
                 auto_task ? "" : " (--task embed)");
        st = json_is_array(modules)
                 ? read_modules(model_dir, modules, out, err)
                 : vlmd_errorf(err, VLMD_ERR_MODEL, "%s is not a list of modules", file);
        /* Qwen3-Embedding is trained for Matryoshka (its card: MRL support, 32 to
         * hidden) though its config.json says nothing of it */
        out->matryoshka = config->arch == VLMD_ARCH_QWEN3;
    } else if (auto_task) {
        out->task = readme_says_reranker(model_dir) ? VLMD_TASK_RERANK : VLMD_TASK_GENERATE;
        snprintf(out->source, sizeof out->source, "%s",
                 out->task == VLMD_TASK_RERANK ? "README.md: a reranker" : "config.json");
    } else {
        out->task = strcmp(flag, "embed") == 0    ? VLMD_TASK_EMBED
                    : strcmp(flag, "rerank") == 0 ? VLMD_TASK_RERANK
                                                  : VLMD_TASK_GENERATE;
        out->embed_too = strcmp(flag, "generate+embed") == 0;
        out->normalize = true; /* embeddings without modules.json: last token, normalised */
        snprintf(out->source, sizeof out->source, "--task %s", flag);
    }
    json_decref(modules);
    if (st == VLMD_OK && vlmd_model_task_serves(out, VLMD_TASK_EMBED))
        read_matryoshka(model_dir, out);
    return st;
}
