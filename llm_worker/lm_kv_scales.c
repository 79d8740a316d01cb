/* lm_kv_scales.c - an FP8 KV cache's per-layer scales (lm.h): read from a
 * checkpoint under the names its producers use, or measured by running text
 * through the model with a 16-bit cache and taking each layer's largest |K|
 * and |V|. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_impl.h"

/* vLLM's constants for scales it measures (calculate_kv_scales): the largest
 * value lands at 200 (K) and 100 (V) of e4m3's 448, room for what the
 * calibration text did not show. */
#define KV_K_SCALE_CONSTANT 200.0f
#define KV_V_SCALE_CONSTANT 100.0f

static bool is_attention(const lm_model *m, int l)
{
    return m->layers[l].state_layer < 0;
}

static vlmd_status scales_alloc(lm_model *m, vlmd_error *err)
{
    if (m->k_scale)
        return VLMD_OK;
    m->k_scale = calloc((size_t)m->L, sizeof *m->k_scale);
    m->v_scale = calloc((size_t)m->L, sizeof *m->v_scale);
    if (!m->k_scale || !m->v_scale)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the KV scales");
    return VLMD_OK;
}

/* The first of names (under the layer's self_attn.) that st has: its one value, > 0. */
static vlmd_status one_scale(const vlmd_safetensors *st, const char *at,
                             const char *const *names, float *out, bool *found,
                             vlmd_error *err)
{
    for (const char *const *n = names; *n; n++) {
        char name[512];
        snprintf(name, sizeof name, "%s%s", at, *n);
        const vlmd_tensor_view *t = vlmd_safetensors_find(st, name);
        if (!t)
            continue;
        float v[1];
        if (vlmd_tensor_numel(t) != 1)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s holds %lld values; a per-tensor KV scale "
                               "is one", name, (long long)vlmd_tensor_numel(t));
        vlmd_status s = vlmd_tensor_to_f32(t, v, err);
        if (s != VLMD_OK)
            return s;
        if (!(v[0] > 0) || !isfinite(v[0]))
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s is %g; a KV scale must be finite and "
                               "positive", name, (double)v[0]);
        *out = v[0];
        *found = true;
        return VLMD_OK;
    }
    *found = false;
    return VLMD_OK;
}

vlmd_status lm_kv_scales_read(lm_model *m, const vlmd_safetensors *st, bool *found,
                              vlmd_error *err)
{
    /* vLLM's maybe_remap_kv_scale_name: compressed-tensors' self_attn.k_scale, older
     * producers' k_proj.k_scale or k_proj.output_scale, or one kv_scale for both */
    static const char *const k_names[] = {"k_scale", "k_proj.k_scale", "k_proj.output_scale",
                                          "kv_scale", NULL};
    static const char *const v_names[] = {"v_scale", "v_proj.v_scale", "v_proj.output_scale",
                                          "kv_scale", NULL};
    int with = 0, attention = 0;
    char first_missing[600] = "";
    float k[m->L], v[m->L];
    for (int l = 0; l < m->L; l++) {
        k[l] = v[l] = 1.0f;
        if (!is_attention(m, l))
            continue;
        attention++;
        char at[512];
        snprintf(at, sizeof at, "%slayers.%d.self_attn.", m->r.names.prefix, l);
        bool has_k, has_v;
        vlmd_status s = one_scale(st, at, k_names, &k[l], &has_k, err);
        if (s == VLMD_OK)
            s = one_scale(st, at, v_names, &v[l], &has_v, err);
        if (s != VLMD_OK)
            return s;
        with += has_k && has_v;
        if (!(has_k && has_v) && !first_missing[0])
            snprintf(first_missing, sizeof first_missing, "%s%s", at, has_k ? "v_scale" : "k_scale");
    }
    *found = with > 0;
    if (with && with < attention)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "the checkpoint has KV scales for %d of its %d "
                           "attention layers: missing tensor %s", with, attention, first_missing);
    return with ? lm_kv_scales_set(m, k, v, err) : VLMD_OK;
}

vlmd_status lm_kv_scales_set(lm_model *m, const float *k, const float *v, vlmd_error *err)
{
    vlmd_status s = scales_alloc(m, err);
    if (s != VLMD_OK)
        return s;
    memcpy(m->k_scale, k, (size_t)m->L * sizeof *k);
    memcpy(m->v_scale, v, (size_t)m->L * sizeof *v);
    return VLMD_OK;
}

bool lm_kv_scales(const lm_model *m, const float **k, const float **v)
{
    *k = m->k_scale;
    *v = m->v_scale;
    return m->k_scale != NULL;
}

/* The largest |x| of n cached elements of type t (host copy). */
static float amax_of(const void *data, vlmd_dtype t, size_t n)
{
    float best = 0;
    for (size_t i = 0; i < n; i++) {
        float x = t == VLMD_DTYPE_F32    ? ((const float *)data)[i]
                  : t == VLMD_DTYPE_BF16 ? vlmd_bf16_to_f32(((const uint16_t *)data)[i])
                                         : vlmd_f16_to_f32(((const uint16_t *)data)[i]);
        best = fabsf(x) > best ? fabsf(x) : best;
    }
    return best;
}

vlmd_status lm_kv_scales_measure(lm_model *m, const int32_t *ids, int n, vlmd_error *err)
{
    vlmd_dtype t = vlmd_backend_kv_dtype(m->b);
    if (t == VLMD_DTYPE_F8_E4M3)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "KV scales are measured with a 16-bit "
                           "cache, before the FP8 one is set");
    if (m->world > 1)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "measuring KV scales over %d ranks is not "
                           "supported yet: use a checkpoint with k_scale/v_scale, or "
                           "--kv-cache-dtype bf16", m->world);
    lm_kv *kv = NULL;
    lm_workspace *ws = NULL;
    size_t row = (size_t)m->nkv * m->hd, bytes = (size_t)n * row * vlmd_dtype_size(t);
    int32_t *pos = malloc(3 * (size_t)n * sizeof *pos), *slots = malloc((size_t)n * sizeof *slots);
    void *host = malloc(bytes);
    float k[m->L], v[m->L];
    vlmd_status s = pos && slots && host ? VLMD_OK
                                         : vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    if (s == VLMD_OK)
        s = lm_kv_create_hybrid(m, n, m->n_linear ? 1 : 0, &kv, err);
    if (s == VLMD_OK)
        s = lm_workspace_create(m, n, 1, n, &ws, err);
    for (int i = 0; s == VLMD_OK && i < n; i++) {
        slots[i] = i;
        for (int r = 0; r < 3; r++)
            pos[r * n + i] = i;
    }
    int32_t last = n - 1, state = 0;
    vlmd_attn_seq seq = {0, n, n, slots};
    lm_batch bt = {n, ids, pos, slots, &seq, 1, &last, 1, NULL, 0, m->n_linear ? &state : NULL};
    if (s == VLMD_OK)
        s = lm_forward(m, kv, ws, &bt, NULL, err);
    for (int l = 0; s == VLMD_OK && l < m->L; l++) {
        k[l] = v[l] = 1.0f;
        if (!is_attention(m, l))
            continue;
        float amax[2];
        for (int which = 0; which < 2 && s == VLMD_OK; which++) {
            s = vlmd_backend_copy_to_host(m->b, host, which ? kv->v[l] : kv->k[l], bytes, err);
            amax[which] = amax_of(host, t, (size_t)n * row);
        }
        /* (an all-zero layer keeps 1: nothing to scale) */
        k[l] = amax[0] > 0 ? amax[0] / KV_K_SCALE_CONSTANT : 1.0f;
        v[l] = amax[1] > 0 ? amax[1] / KV_V_SCALE_CONSTANT : 1.0f;
    }
    if (s == VLMD_OK)
        s = lm_kv_scales_set(m, k, v, err);
    lm_workspace_free(m, ws);
    lm_kv_free(m, kv);
    free(pos);
    free(slots);
    free(host);
    return s;
}
