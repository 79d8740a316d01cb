/* test_model_task.c - a checkpoint's task from its published files: the two
 * fixtures as published, --task over them, and what vlmd cannot pool refused
 * naming what was found (written into copies of the embedding fixture). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_task.h"

static vlmd_model_config qwen3 = {.arch = VLMD_ARCH_QWEN3};
static vlmd_model_config qwen2 = {.arch = VLMD_ARCH_QWEN2};

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* A model directory with a sentence-transformers pipeline of the given
 * modules.json and pooling config (NULL: no 1_Pooling). */
static void make_dir(char *dir, const char *modules, const char *pooling)
{
    strcpy(dir, "/tmp/vlmd-task-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    write_file(dir, "config.json", "{\"architectures\": [\"Qwen3ForCausalLM\"]}");
    if (modules)
        write_file(dir, "modules.json", modules);
    if (pooling) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
        cr_assert_eq(mkdir(sub, 0700), 0);
        write_file(dir, "1_Pooling/config.json", pooling);
    }
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

#define PIPELINE(last)                                                                        \
    "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "                              \
    "\"sentence_transformers.models.Transformer\"}, {\"idx\": 1, \"name\": \"1\", \"path\": " \
    "\"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"}" last "]"
#define NORMALIZE                                                                             \
    ", {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": "                  \
    "\"sentence_transformers.models.Normalize\"}"

Test(model_task, the_fixtures_as_published)
{
    vlmd_model_task t;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_task_detect(VLMD_FIXTURES_DIR "/qwen3_embedding", "auto", &qwen3, &t,
                                        &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(t.task, VLMD_TASK_EMBED);
    cr_expect(t.normalize, "its Normalize module");
    cr_expect(t.matryoshka, "Qwen3-Embedding: MRL, by its card");
    cr_assert_eq(vlmd_model_task_detect(VLMD_FIXTURES_DIR "/qwen3_reranker", "auto", &qwen3, &t,
                                        &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(t.task, VLMD_TASK_RERANK, "its README's heading names a reranker");
    cr_assert_eq(vlmd_model_task_detect(VLMD_FIXTURES_DIR "/qwen3", "auto", &qwen3, &t, &err),
                 VLMD_OK, "%s", err.msg);
    cr_expect_eq(t.task, VLMD_TASK_GENERATE);
    cr_expect_not(vlmd_model_task_serves(&t, VLMD_TASK_EMBED));
}

Test(model_task, the_flag_decides_over_the_files)
{
    vlmd_model_task t;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_task_detect(VLMD_FIXTURES_DIR "/qwen3_reranker", "generate", &qwen3,
                                        &t, &err), VLMD_OK);
    cr_expect_eq(t.task, VLMD_TASK_GENERATE);
    cr_assert_eq(vlmd_model_task_detect(VLMD_FIXTURES_DIR "/qwen3", "rerank", &qwen3, &t, &err),
                 VLMD_OK);
    cr_expect_eq(t.task, VLMD_TASK_RERANK);
    cr_assert_eq(vlmd_model_task_detect(VLMD_FIXTURES_DIR "/qwen2", "generate+embed", &qwen2, &t,
                                        &err), VLMD_OK);
    cr_expect_eq(t.task, VLMD_TASK_GENERATE);
    cr_expect(vlmd_model_task_serves(&t, VLMD_TASK_GENERATE) &&
              vlmd_model_task_serves(&t, VLMD_TASK_EMBED));
    cr_expect_not(vlmd_model_task_serves(&t, VLMD_TASK_RERANK));
    cr_expect(t.normalize);
    cr_expect_not(t.matryoshka, "nothing says this model was trained for shorter vectors");
}

Test(model_task, pooling_vlmd_cannot_reproduce_is_refused_naming_it)
{
    static const struct {
        const char *modules, *pooling, *named;
    } cases[] = {
        {PIPELINE(NORMALIZE), "{\"pooling_mode_mean_tokens\": true}", "pooling_mode_mean_tokens"},
        {PIPELINE(NORMALIZE), "{\"pooling_mode_cls_token\": true, \"pooling_mode_lasttoken\": true}",
         "pooling_mode_cls_token"},
        {PIPELINE(NORMALIZE), "{}", "no pooling mode set"},
        {PIPELINE(NORMALIZE), "{\"pooling_mode_lasttoken\": true, \"include_prompt\": false}",
         "include_prompt"},
        {PIPELINE(", {\"idx\": 2, \"path\": \"2_Dense\", \"type\": "
                  "\"sentence_transformers.models.Dense\"}"),
         "{\"pooling_mode_lasttoken\": true}", "sentence_transformers.models.Dense"},
        {"[{\"type\": \"sentence_transformers.models.Transformer\"}]", NULL, "no Pooling module"},
        {"{\"not\": \"a list\"}", NULL, "not a list"},
        {"[{\"type\": ", NULL, "modules.json"},
        {PIPELINE(""), NULL, "1_Pooling/config.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64];
        make_dir(dir, cases[i].modules, cases[i].pooling);
        vlmd_model_task t;
        vlmd_error err = {0};
        cr_expect_eq(vlmd_model_task_detect(dir, "auto", &qwen3, &t, &err), VLMD_ERR_MODEL,
                     "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].named), "case %zu: %s", i, err.msg);
        /* --task generate serves it as the causal LM it also is (a modules.json
         * that does not parse is refused whatever the flag) */
        bool parses = cases[i].modules[strlen(cases[i].modules) - 1] != ' ';
        cr_expect_eq(vlmd_model_task_detect(dir, "generate", &qwen3, &t, &err),
                     parses ? VLMD_OK : VLMD_ERR_MODEL, "case %zu", i);
        remove_dir(dir);
    }
}

Test(model_task, normalize_and_matryoshka_as_the_files_say)
{
    char dir[64];
    make_dir(dir, PIPELINE(""), "{\"pooling_mode_lasttoken\": true}");
    vlmd_model_task t;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_task_detect(dir, "auto", &qwen2, &t, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(t.task, VLMD_TASK_EMBED);
    cr_expect_not(t.normalize, "no Normalize module: the pooled vector as it is");
    cr_expect_not(t.matryoshka, "not Qwen3-Embedding, and its config says nothing");
    write_file(dir, "config.json", "{\"matryoshka_dimensions\": [64, 256, 1024]}");
    cr_assert_eq(vlmd_model_task_detect(dir, "auto", &qwen2, &t, &err), VLMD_OK, "%s", err.msg);
    cr_expect(t.matryoshka);
    cr_expect_eq(t.n_mrl_dims, 3);
    cr_expect_eq(t.mrl_dims[1], 256);
    remove_dir(dir);
}

Test(model_task, a_readme_front_matter_says_text_ranking)
{
    char dir[64];
    make_dir(dir, NULL, NULL);
    write_file(dir, "README.md", "---\nlicense: apache-2.0\npipeline_tag: text-ranking\n---\n"
                                 "# Some model\n");
    vlmd_model_task t;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_task_detect(dir, "auto", &qwen3, &t, &err), VLMD_OK);
    cr_expect_eq(t.task, VLMD_TASK_RERANK);
    write_file(dir, "README.md", "---\npipeline_tag: text-generation\n---\n# Qwen3-8B\n\n"
                                 "## Use with a reranker\n");
    cr_assert_eq(vlmd_model_task_detect(dir, "auto", &qwen3, &t, &err), VLMD_OK);
    cr_expect_eq(t.task, VLMD_TASK_GENERATE, "only the first heading names the model");
    remove_dir(dir);
}
