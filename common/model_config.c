/* model_config.c - config.json of a Hugging Face checkpoint into vlmd_model_config.
 *
 * Reads both config shapes (docs/ARCHITECTURE.md, Backends): text fields at the top level or in
 * text_config; RoPE settings in rope_scaling or rope_parameters, either at the
 * text level or the top. Every error names the file and the field. */
#include "model_config.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "buf.h"

#define CONFIG_MAX_BYTES (4u << 20)

static const struct {
    const char *name;
    vlmd_arch arch;
} known_archs[] = {
    {"Qwen2ForCausalLM", VLMD_ARCH_QWEN2},
    {"Qwen2VLForConditionalGeneration", VLMD_ARCH_QWEN2_VL},
    {"Qwen2_5_VLForConditionalGeneration", VLMD_ARCH_QWEN2_5_VL},
    {"Qwen3ForCausalLM", VLMD_ARCH_QWEN3},
    {"Qwen3MoeForCausalLM", VLMD_ARCH_QWEN3_MOE},
    {"Qwen3VLForConditionalGeneration", VLMD_ARCH_QWEN3_VL},
    {"Qwen3VLMoeForConditionalGeneration", VLMD_ARCH_QWEN3_VL_MOE},
    {"Glm4MoeForCausalLM", VLMD_ARCH_GLM4_MOE},
    {"MixtralForCausalLM", VLMD_ARCH_MIXTRAL},
    {"Qwen3_5ForConditionalGeneration", VLMD_ARCH_QWEN3_5},
    {"Qwen3_5MoeForConditionalGeneration", VLMD_ARCH_QWEN3_5_MOE},
};

static bool arch_is_qwen3(vlmd_arch a)
{
    return a == VLMD_ARCH_QWEN3 || a == VLMD_ARCH_QWEN3_MOE || a == VLMD_ARCH_QWEN3_VL ||
           a == VLMD_ARCH_QWEN3_VL_MOE;
}

static bool arch_is_qwen3_5(vlmd_arch a)
{
    return a == VLMD_ARCH_QWEN3_5 || a == VLMD_ARCH_QWEN3_5_MOE;
}

static bool arch_has_vision(vlmd_arch a)
{
    return a == VLMD_ARCH_QWEN2_VL || a == VLMD_ARCH_QWEN2_5_VL || a == VLMD_ARCH_QWEN3_VL ||
           a == VLMD_ARCH_QWEN3_VL_MOE || arch_is_qwen3_5(a);
}

bool vlmd_text_layer_is_moe(const vlmd_text_config *t, int64_t layer)
{
    if (t->num_experts == 0 || layer < 0 || layer >= VLMD_MAX_LAYERS)
        return false;
    if (t->mlp_only_layers[layer / 64] >> (layer % 64) & 1)
        return false;
    return (layer + 1) % t->decoder_sparse_step == 0;
}

bool vlmd_text_layer_is_linear(const vlmd_text_config *t, int64_t layer)
{
    return layer >= 0 && layer < VLMD_MAX_LAYERS && (t->linear_layers[layer / 64] >> (layer % 64) & 1);
}

const char *vlmd_arch_str(vlmd_arch arch)
{
    for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++)
        if (known_archs[i].arch == arch)
            return known_archs[i].name;
    return "?";
}

/* Reads an integer field; absent is an error when def < 0 is not allowed. */
static vlmd_status get_int(const json_t *obj, const char *key, bool required, int64_t def,
                           int64_t min, int64_t *out, const char *path, vlmd_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: missing integer field '%s'", path, key);
        *out = def;
        return VLMD_OK;
    }
    if (!json_is_integer(v))
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: field '%s' is not an integer", path, key);
    int64_t x = json_integer_value(v);
    if (x < min)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: field '%s' is %lld, less than %lld", path, key,
                           (long long)x, (long long)min);
    *out = x;
    return VLMD_OK;
}

static vlmd_status get_num(const json_t *obj, const char *key, bool required, double def,
                           double *out, const char *path, vlmd_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: missing number field '%s'", path, key);
        *out = def;
        return VLMD_OK;
    }
    if (!json_is_number(v))
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: field '%s' is not a number", path, key);
    *out = json_number_value(v);
    return VLMD_OK;
}

/* eos_token_id may be an int or a list of ints (the first is taken). */
static int64_t get_token_id(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (json_is_array(v) && json_array_size(v) > 0)
        v = json_array_get(v, 0);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* Every id of an int or a list of ints (at most VLMD_MAX_EOS) into ids. */
static int get_token_ids(const json_t *obj, const char *key, int64_t *ids)
{
    const json_t *v = json_object_get(obj, key);
    int n = 0;
    if (json_is_integer(v))
        ids[n++] = json_integer_value(v);
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v) && n < VLMD_MAX_EOS; i++)
        if (json_is_integer(json_array_get(v, i)) && json_integer_value(json_array_get(v, i)) >= 0)
            ids[n++] = json_integer_value(json_array_get(v, i));
    return n;
}

/* Finds the RoPE settings object: rope_parameters or rope_scaling, text level first. */
static const json_t *find_rope(const json_t *text, const json_t *root)
{
    const char *keys[] = {"rope_parameters", "rope_scaling"};
    const json_t *scopes[] = {text, root};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 2; k++) {
            const json_t *r = json_object_get(scopes[s], keys[k]);
            if (json_is_object(r))
                return r;
        }
    return NULL;
}

/* A list of small non-negative integers (indexes below `limit`) into out;
 * absent is an empty list. */
static vlmd_status get_index_list(const json_t *obj, const char *key, int64_t limit, int64_t *out,
                                  int cap, int *n, const char *path, vlmd_error *err)
{
    const json_t *v = json_object_get(obj, key);
    *n = 0;
    if (!v || json_is_null(v))
        return VLMD_OK;
    if (!json_is_array(v) || json_array_size(v) > (size_t)cap)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: '%s' is not a list of at most %d integers",
                           path, key, cap);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= limit)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s[%zu] is not an index below %lld",
                               path, key, i, (long long)limit);
        out[(*n)++] = json_integer_value(x);
    }
    return VLMD_OK;
}

/* GLM-4.5's router and shared expert (DeepSeek-V3's fields), after parse_moe. */
static vlmd_status parse_glm_moe(const json_t *text, const char *path, vlmd_text_config *t,
                                 vlmd_error *err)
{
    vlmd_status st;
    int64_t n_shared, first_dense;
    t->router = VLMD_ROUTER_SIGMOID;
    if ((st = get_int(text, "n_group", false, 1, 1, &t->n_group, path, err)) != VLMD_OK ||
        (st = get_int(text, "topk_group", false, 1, 1, &t->topk_group, path, err)) != VLMD_OK ||
        (st = get_num(text, "routed_scaling_factor", false, 1.0, &t->routed_scaling_factor, path,
                      err)) != VLMD_OK ||
        (st = get_int(text, "n_shared_experts", false, 0, 0, &n_shared, path, err)) != VLMD_OK ||
        (st = get_int(text, "first_k_dense_replace", false, 0, 0, &first_dense, path, err)) !=
            VLMD_OK ||
        (st = get_int(text, "num_nextn_predict_layers", false, 0, 0,
                      &t->num_nextn_predict_layers, path, err)) != VLMD_OK)
        return st;
    if (t->num_experts % t->n_group || t->topk_group > t->n_group ||
        t->num_experts_per_tok > t->topk_group * (t->num_experts / t->n_group))
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %lld experts in n_group %lld groups, "
                           "topk_group %lld of them, cannot give num_experts_per_tok %lld", path,
                           (long long)t->num_experts, (long long)t->n_group,
                           (long long)t->topk_group, (long long)t->num_experts_per_tok);
    if (t->num_experts / t->n_group < 2)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: a group's score is its two best experts', "
                           "so groups of %lld experts are not supported", path,
                           (long long)(t->num_experts / t->n_group));
    t->shared_expert_size = t->moe_intermediate_size * n_shared;
    for (int64_t l = 0; l < first_dense && l < t->num_layers; l++)
        t->mlp_only_layers[l / 64] |= 1ull << (l % 64);
    return VLMD_OK;
}

/* The expert fields (num_experts absent or 0: a dense model), under the
 * architecture's names: num_experts (Qwen3-MoE), n_routed_experts (GLM),
 * num_local_experts (Mixtral, whose experts are intermediate_size wide). */
static vlmd_status parse_moe(const json_t *text, vlmd_arch arch, const char *path,
                             vlmd_text_config *t, vlmd_error *err)
{
    vlmd_status st;
    const char *count = arch == VLMD_ARCH_GLM4_MOE   ? "n_routed_experts"
                        : arch == VLMD_ARCH_MIXTRAL ? "num_local_experts"
                                                    : "num_experts";
    t->routed_scaling_factor = 1.0;
    t->n_group = t->topk_group = 1;
    if ((st = get_int(text, count, arch == VLMD_ARCH_MIXTRAL || arch == VLMD_ARCH_GLM4_MOE, 0,
                      0, &t->num_experts, path, err)) != VLMD_OK ||
        t->num_experts == 0)
        return st;
    if (arch == VLMD_ARCH_MIXTRAL) { /* every layer's experts, always renormalised */
        t->moe_intermediate_size = t->intermediate_size;
        t->norm_topk_prob = true;
        t->decoder_sparse_step = 1;
        if ((st = get_int(text, "num_experts_per_tok", true, 0, 1, &t->num_experts_per_tok,
                          path, err)) != VLMD_OK)
            return st;
        if (t->num_experts_per_tok > t->num_experts)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: num_experts_per_tok %lld is more than "
                               "num_local_experts %lld", path, (long long)t->num_experts_per_tok,
                               (long long)t->num_experts);
        return VLMD_OK;
    }
    if ((st = get_int(text, "num_experts_per_tok", true, 0, 1, &t->num_experts_per_tok, path,
                      err)) != VLMD_OK ||
        (st = get_int(text, "moe_intermediate_size", true, 0, 1, &t->moe_intermediate_size, path,
                      err)) != VLMD_OK ||
        (st = get_int(text, "decoder_sparse_step", false, 1, 1, &t->decoder_sparse_step, path,
                      err)) != VLMD_OK)
        return st;
    if (t->num_experts_per_tok > t->num_experts)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: num_experts_per_tok %lld is more than "
                           "num_experts %lld", path, (long long)t->num_experts_per_tok,
                           (long long)t->num_experts);
    t->norm_topk_prob = json_is_true(json_object_get(text, "norm_topk_prob"));
    int64_t dense[VLMD_MAX_LAYERS];
    int n_dense = 0;
    if ((st = get_index_list(text, "mlp_only_layers", t->num_layers, dense, VLMD_MAX_LAYERS,
                             &n_dense, path, err)) != VLMD_OK)
        return st;
    for (int i = 0; i < n_dense; i++)
        t->mlp_only_layers[dense[i] / 64] |= 1ull << (dense[i] % 64);
    return arch == VLMD_ARCH_GLM4_MOE ? parse_glm_moe(text, path, t, err) : VLMD_OK;
}

/* Qwen3.5's hybrid layers: which are Gated DeltaNet (layer_types, or all but every
 * full_attention_interval-th), their heads, the gated attention, the (1 + w) norms and,
 * for the MoE, the gated shared expert and the always-renormalised router. */
static vlmd_status parse_hybrid(const json_t *text, vlmd_arch arch, const char *path,
                                vlmd_text_config *t, vlmd_error *err)
{
    vlmd_status st;
    const json_t *types = json_object_get(text, "layer_types");
    int64_t interval = 0;
    if (json_is_array(types)) {
        if ((int64_t)json_array_size(types) != t->num_layers)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: layer_types lists %zu layers, "
                               "num_hidden_layers is %lld", path, json_array_size(types),
                               (long long)t->num_layers);
        for (int64_t l = 0; l < t->num_layers; l++) {
            const char *kind = json_string_value(json_array_get(types, (size_t)l));
            bool linear = kind && strcmp(kind, "linear_attention") == 0;
            if (!linear && (!kind || strcmp(kind, "full_attention") != 0))
                return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: layer_types[%lld] is '%s' "
                                   "(linear_attention or full_attention)", path, (long long)l,
                                   kind ? kind : "?");
            t->linear_layers[l / 64] |= (uint64_t)linear << (l % 64);
        }
    } else {
        if ((st = get_int(text, "full_attention_interval", false, 4, 1, &interval, path, err)) !=
            VLMD_OK)
            return st;
        for (int64_t l = 0; l < t->num_layers; l++)
            t->linear_layers[l / 64] |= (uint64_t)((l + 1) % interval != 0) << (l % 64);
    }
    if ((st = get_int(text, "linear_num_key_heads", true, 0, 1, &t->linear_key_heads, path,
                      err)) != VLMD_OK ||
        (st = get_int(text, "linear_num_value_heads", true, 0, 1, &t->linear_value_heads, path,
                      err)) != VLMD_OK ||
        (st = get_int(text, "linear_key_head_dim", true, 0, 1, &t->linear_key_dim, path, err)) !=
            VLMD_OK ||
        (st = get_int(text, "linear_value_head_dim", true, 0, 1, &t->linear_value_dim, path,
                      err)) != VLMD_OK ||
        (st = get_int(text, "linear_conv_kernel_dim", false, 4, 1, &t->linear_conv_kernel, path,
                      err)) != VLMD_OK)
        return st;
    if (t->linear_value_heads % t->linear_key_heads)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: linear_num_value_heads %lld is not a "
                           "multiple of linear_num_key_heads %lld", path,
                           (long long)t->linear_value_heads, (long long)t->linear_key_heads);
    const char *ssm = json_string_value(json_object_get(text, "mamba_ssm_dtype"));
    if (ssm && strcmp(ssm, "float32") != 0)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: mamba_ssm_dtype '%s' (the recurrent state "
                           "is kept in float32 only)", path, ssm);
    const json_t *gate = json_object_get(text, "attn_output_gate");
    t->attn_output_gate = !gate || json_is_true(gate);
    t->norm_unit_offset = true;
    if (arch == VLMD_ARCH_QWEN3_5_MOE) { /* every layer's experts, always renormalised */
        int64_t shared = 0;
        if ((st = get_int(text, "shared_expert_intermediate_size", false, 0, 0, &shared, path,
                          err)) != VLMD_OK)
            return st;
        t->shared_expert_size = shared;
        t->shared_expert_gate = shared > 0;
        t->norm_topk_prob = true;
    }
    return VLMD_OK;
}

static vlmd_status parse_text(const json_t *root, vlmd_arch arch, const char *path,
                              vlmd_text_config *t, vlmd_error *err)
{
    const json_t *text = json_object_get(root, "text_config");
    if (!json_is_object(text))
        text = root;
    vlmd_status st;
#define INT_FIELD(key, field, req, def, min)                                                   \
    if ((st = get_int(text, key, req, def, min, &t->field, path, err)) != VLMD_OK)             \
        return st;
    INT_FIELD("hidden_size", hidden_size, true, 0, 1)
    /* a Qwen3.5 MoE has no dense MLP, so no intermediate_size */
    INT_FIELD("intermediate_size", intermediate_size, arch != VLMD_ARCH_QWEN3_5_MOE, 0, 0)
    INT_FIELD("num_hidden_layers", num_layers, true, 0, 1)
    INT_FIELD("num_attention_heads", num_heads, true, 0, 1)
    INT_FIELD("num_key_value_heads", num_kv_heads, false, t->num_heads, 1)
    INT_FIELD("vocab_size", vocab_size, true, 0, 1)
    INT_FIELD("max_position_embeddings", max_position_embeddings, true, 0, 1)
    INT_FIELD("head_dim", head_dim, false, t->hidden_size / t->num_heads, 1)
#undef INT_FIELD
    if (t->num_layers > VLMD_MAX_LAYERS)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: num_hidden_layers %lld is more than %d",
                           path, (long long)t->num_layers, VLMD_MAX_LAYERS);
    if (t->num_heads % t->num_kv_heads)
        return vlmd_errorf(err, VLMD_ERR_MODEL,
                           "%s: num_attention_heads %lld is not a multiple of num_key_value_heads "
                           "%lld", path, (long long)t->num_heads, (long long)t->num_kv_heads);
    if ((st = get_num(text, "rms_norm_eps", false, 1e-6, &t->rms_norm_eps, path, err)) != VLMD_OK)
        return st;
    const json_t *tie = json_object_get(text, "tie_word_embeddings");
    if (!tie)
        tie = json_object_get(root, "tie_word_embeddings");
    t->tie_word_embeddings = json_is_true(tie);
    t->bos_token_id = get_token_id(text, "bos_token_id");
    t->eos_token_id = get_token_id(text, "eos_token_id");
    t->n_eos = get_token_ids(text, "eos_token_id", t->eos_ids);
    /* Qwen2's q, k and v always have biases; Qwen3's, Qwen3.5's and GLM's say so in
     * attention_bias; Mixtral's have none. Qwen3 and Qwen3.5 have q/k norm always, GLM when
     * use_qk_norm. */
    bool glm = arch == VLMD_ARCH_GLM4_MOE, q35 = arch_is_qwen3_5(arch);
    t->qkv_bias = arch != VLMD_ARCH_MIXTRAL &&
                  ((!arch_is_qwen3(arch) && !glm && !q35) ||
                   json_is_true(json_object_get(text, "attention_bias")));
    t->qk_norm = arch_is_qwen3(arch) || q35 ||
                 (glm && json_is_true(json_object_get(text, "use_qk_norm")));
    double partial = 1.0;
    const json_t *rope_params = json_object_get(text, "rope_parameters");
    if ((st = get_num(json_object_get(rope_params, "partial_rotary_factor") ? rope_params : text,
                      "partial_rotary_factor", false, 1.0, &partial, path, err)) != VLMD_OK)
        return st;
    t->rotary_dim = (int64_t)((double)t->head_dim * partial);
    if (partial <= 0 || partial > 1 || t->rotary_dim % 2)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: partial_rotary_factor %g of head_dim %lld "
                           "is not an even number of dims", path, partial,
                           (long long)t->head_dim);
    if (arch == VLMD_ARCH_MIXTRAL) {
        const json_t *sw = json_object_get(text, "sliding_window");
        if (json_is_integer(sw) && json_integer_value(sw) < t->max_position_embeddings)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: sliding_window %lld is shorter than "
                               "max_position_embeddings %lld: sliding-window attention is not "
                               "supported", path, (long long)json_integer_value(sw),
                               (long long)t->max_position_embeddings);
    }
    if ((st = parse_moe(text, arch, path, t, err)) != VLMD_OK ||
        (q35 && (st = parse_hybrid(text, arch, path, t, err)) != VLMD_OK))
        return st;
    if ((arch == VLMD_ARCH_QWEN3_MOE || arch == VLMD_ARCH_QWEN3_VL_MOE ||
         arch == VLMD_ARCH_QWEN3_5_MOE) && !t->num_experts)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: a mixture-of-experts model needs "
                           "'num_experts'", path);
    /* transformers' Qwen3VLMoeTextRouter renormalises whatever the config says */
    if (arch == VLMD_ARCH_QWEN3_VL_MOE)
        t->norm_topk_prob = true;

    const json_t *rope = find_rope(text, root);
    double theta_default = 10000.0;
    get_num(text, "rope_theta", false, theta_default, &theta_default, path, NULL);
    if ((st = get_num(rope ? rope : text, "rope_theta", false, theta_default, &t->rope_theta,
                      path, err)) != VLMD_OK)
        return st;
    const json_t *sec = rope ? json_object_get(rope, "mrope_section") : NULL;
    t->n_mrope_section = 0;
    if (sec) {
        if (!json_is_array(sec) || json_array_size(sec) != 3)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: mrope_section is not a list of 3 integers",
                               path);
        int64_t sum = 0;
        for (int i = 0; i < 3; i++) {
            const json_t *x = json_array_get(sec, (size_t)i);
            if (!json_is_integer(x) || json_integer_value(x) < 0)
                return vlmd_errorf(err, VLMD_ERR_MODEL,
                                   "%s: mrope_section[%d] is not a non-negative integer", path, i);
            t->mrope_section[i] = json_integer_value(x);
            sum += t->mrope_section[i];
        }
        if (sum * 2 != t->rotary_dim) /* the rotary dims' frequencies (all: head_dim / 2) */
            return vlmd_errorf(err, VLMD_ERR_MODEL,
                               "%s: mrope_section sums to %lld, but the rotary dims have %lld "
                               "frequencies", path, (long long)sum,
                               (long long)(t->rotary_dim / 2));
        t->n_mrope_section = 3;
        /* Qwen3-VL and Qwen3.5 always interleave (their configs may say so, or not) */
        t->mrope_interleaved = arch == VLMD_ARCH_QWEN3_VL || arch == VLMD_ARCH_QWEN3_VL_MOE ||
                               q35 || json_is_true(json_object_get(rope, "mrope_interleaved"));
    }
    return VLMD_OK;
}

static vlmd_status parse_vision(const json_t *v, vlmd_arch arch, const char *path,
                                vlmd_vision_config *vc, vlmd_error *err)
{
    vlmd_status st;
    int64_t mlp_ratio = 4;
    char vpath[4200];
    snprintf(vpath, sizeof vpath, "%s (vision_config)", path);
    path = vpath;
#define INT_FIELD(key, field, req, def, min)                                                   \
    if ((st = get_int(v, key, req, def, min, &vc->field, path, err)) != VLMD_OK)               \
        return st;
    INT_FIELD("depth", depth, true, 0, 1)
    INT_FIELD("num_heads", num_heads, true, 0, 1)
    INT_FIELD("patch_size", patch_size, true, 0, 1)
    INT_FIELD("spatial_merge_size", spatial_merge_size, true, 0, 1)
    INT_FIELD("temporal_patch_size", temporal_patch_size, true, 0, 1)
    INT_FIELD("in_channels", in_channels, false, 3, 1)
    if (arch == VLMD_ARCH_QWEN2_VL) {
        vc->act = VLMD_ACT_QUICK_GELU;
        INT_FIELD("embed_dim", embed_dim, true, 0, 1)
        INT_FIELD("hidden_size", hidden_size, true, 0, 1)
        if ((st = get_int(v, "mlp_ratio", false, 4, 1, &mlp_ratio, path, err)) != VLMD_OK)
            return st;
        vc->intermediate_size = vc->embed_dim * mlp_ratio;
        vc->out_hidden_size = vc->hidden_size;
    } else {
        INT_FIELD("hidden_size", embed_dim, true, 0, 1)
        INT_FIELD("out_hidden_size", out_hidden_size, true, 0, 1)
        INT_FIELD("intermediate_size", intermediate_size, true, 0, 1)
        INT_FIELD("window_size", window_size, false, 0, 0)
        vc->hidden_size = vc->out_hidden_size;
        vc->act = arch == VLMD_ARCH_QWEN2_5_VL ? VLMD_ACT_SILU : VLMD_ACT_GELU_TANH;
    }
    if (arch == VLMD_ARCH_QWEN3_VL || arch == VLMD_ARCH_QWEN3_VL_MOE || arch_is_qwen3_5(arch)) {
        INT_FIELD("num_position_embeddings", num_position_embeddings, true, 0, 1)
        int64_t side = 1;
        while (side * side < vc->num_position_embeddings)
            side++;
        if (side * side != vc->num_position_embeddings)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: num_position_embeddings %lld is not a "
                               "square", path, (long long)vc->num_position_embeddings);
        if ((st = get_index_list(v, "deepstack_visual_indexes", vc->depth,
                                 vc->deepstack_visual_indexes, 16, &vc->n_deepstack, path,
                                 err)) != VLMD_OK)
            return st;
        const char *act = json_string_value(json_object_get(v, "hidden_act"));
        if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: hidden_act '%s' is not supported "
                               "(gelu_pytorch_tanh)", path, act);
    }
#undef INT_FIELD
    if (vc->embed_dim % vc->num_heads)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: width %lld is not a multiple "
                           "of num_heads %lld", path, (long long)vc->embed_dim,
                           (long long)vc->num_heads);
    const json_t *full = json_object_get(v, "fullatt_block_indexes");
    if (json_is_array(full)) {
        size_t n = json_array_size(full);
        if (n > sizeof vc->fullatt_block_indexes / sizeof vc->fullatt_block_indexes[0])
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: too many fullatt_block_indexes (%zu)",
                               path, n);
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(full, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= vc->depth)
                return vlmd_errorf(err, VLMD_ERR_MODEL,
                                   "%s: fullatt_block_indexes[%zu] is not a block index", path, i);
            vc->fullatt_block_indexes[i] = json_integer_value(x);
        }
        vc->n_fullatt_blocks = (int)n;
    }
    return VLMD_OK;
}

vlmd_status vlmd_model_config_parse(const char *json_text, const char *path,
                                    vlmd_model_config *out, vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s:%d: invalid JSON: %s", path, jerr.line,
                           jerr.text);
    vlmd_status st = VLMD_OK;
    if (!json_is_object(root)) {
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: not a JSON object", path);
        goto done;
    }
    const json_t *archs = json_object_get(root, "architectures");
    const char *name = json_string_value(json_array_get(archs, 0));
    if (!name) {
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: missing 'architectures'", path);
        goto done;
    }
    bool found = false;
    for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++) {
        if (strcmp(name, known_archs[i].name) == 0) {
            out->arch = known_archs[i].arch;
            found = true;
        }
    }
    if (!found) {
        st = vlmd_errorf(err, VLMD_ERR_MODEL,
                         "%s: architecture '%s' is not supported (Qwen2ForCausalLM, "
                         "Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration, "
                         "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3VLForConditionalGeneration, "
                         "Qwen3VLMoeForConditionalGeneration, Glm4MoeForCausalLM, "
                         "MixtralForCausalLM, Qwen3_5ForConditionalGeneration, "
                         "Qwen3_5MoeForConditionalGeneration)", path, name);
        goto done;
    }
    vlmd_strlcpy(out->architecture, name, sizeof out->architecture);
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    vlmd_strlcpy(out->model_type, mt ? mt : "", sizeof out->model_type);
    if ((st = parse_text(root, out->arch, path, &out->text, err)) != VLMD_OK ||
        (st = vlmd_quant_config_parse(root, path, &out->quant, err)) != VLMD_OK)
        goto done;
    out->image_token_id = get_token_id(root, "image_token_id");
    out->vision_start_token_id = get_token_id(root, "vision_start_token_id");
    out->vision_end_token_id = get_token_id(root, "vision_end_token_id");
    if (arch_has_vision(out->arch)) {
        const json_t *v = json_object_get(root, "vision_config");
        if (!json_is_object(v)) {
            st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s needs a 'vision_config' object", path,
                             name);
            goto done;
        }
        if ((st = parse_vision(v, out->arch, path, &out->vision, err)) != VLMD_OK)
            goto done;
        if (out->vision.n_deepstack > out->text.num_layers) {
            st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %d deepstack_visual_indexes, but the text "
                             "model has %lld layers to add their features after", path,
                             out->vision.n_deepstack, (long long)out->text.num_layers);
            goto done;
        }
        if (out->text.n_mrope_section != 3) {
            st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s needs rope mrope_section", path, name);
            goto done;
        }
        if (out->image_token_id < 0) {
            st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: missing 'image_token_id'", path);
            goto done;
        }
        out->has_vision = true;
    }
done:
    json_decref(root);
    if (st != VLMD_OK)
        memset(out, 0, sizeof *out);
    return st;
}

vlmd_status vlmd_model_config_load(const char *dir, vlmd_model_config *out, vlmd_error *err)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "model path too long: %s", dir);
    vlmd_buf text = VLMD_BUF_INIT;
    vlmd_status st = vlmd_read_file(path, CONFIG_MAX_BYTES, &text, err);
    if (st == VLMD_OK)
        st = vlmd_model_config_parse(text.data, path, out, err);
    else
        vlmd_error_prefix(err, "model directory %s", dir);
    vlmd_buf_free(&text);
    return st;
}

uint64_t vlmd_image_token_bytes(const vlmd_model_config *mc)
{
    return (1 + (uint64_t)mc->vision.n_deepstack) * (uint64_t)mc->text.hidden_size * sizeof(float);
}
