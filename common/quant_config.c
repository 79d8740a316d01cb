/* quant_config.c - config.json's quantization_config (quant_config.h), as
 * the producing libraries write it: transformers' FineGrainedFP8Config
 * ("fp8"), compressed-tensors' QuantizationConfig (config_groups, format,
 * kv_cache_scheme), AutoAWQ and GPTQ's (transformers' GPTQConfig or
 * GPTQModel's, told apart by checkpoint_format). */
#include "quant_config.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

static vlmd_status refuse(vlmd_error *err, const char *path, const char *what)
{
    return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: quantization_config %s; vlmd serves %s", path,
                       what, VLMD_QUANT_SUPPORTED);
}

static int64_t int_or(const json_t *o, const char *key, int64_t def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : def;
}

static const char *str_or(const json_t *o, const char *key, const char *def)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : def;
}

static vlmd_status parse_fp8(const json_t *qc, const char *path, vlmd_quant_config *q,
                             vlmd_error *err)
{
    char what[160];
    const char *fmt = str_or(qc, "fmt", "e4m3");
    if (strcmp(fmt, "e4m3") != 0) {
        snprintf(what, sizeof what, "fp8 fmt '%s' (e4m3 only)", fmt);
        return refuse(err, path, what);
    }
    q->method = VLMD_QUANT_FP8;
    q->bits = 8;
    const json_t *bs = json_object_get(qc, "weight_block_size");
    if (json_is_array(bs)) {
        int64_t r = json_integer_value(json_array_get(bs, 0)),
                c = json_integer_value(json_array_get(bs, 1));
        if (json_array_size(bs) != 2 || r <= 0 || c <= 0 || r > 4096 || c > 4096) {
            snprintf(what, sizeof what, "fp8 weight_block_size is not two block sizes");
            return refuse(err, path, what);
        }
        q->block[0] = (int)r, q->block[1] = (int)c;
    }
    return VLMD_OK;
}

/* compressed-tensors' one scheme (its config_groups' only group) */
static vlmd_status parse_ct(const json_t *qc, const char *path, vlmd_quant_config *q,
                            vlmd_error *err)
{
    char what[200];
    const json_t *groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1) {
        snprintf(what, sizeof what, "compressed-tensors with %zu config_groups (one scheme for "
                 "every linear only)", json_is_object(groups) ? json_object_size(groups) : 0);
        return refuse(err, path, what);
    }
    const char *gname;
    const json_t *g;
    json_object_foreach((json_t *)groups, gname, g) {
        const json_t *w = json_object_get(g, "weights");
        const char *format = str_or(g, "format", str_or(qc, "format", "")),
                   *type = str_or(w, "type", ""), *strategy = str_or(w, "strategy", ""),
                   *actorder = str_or(w, "actorder", "");
        int64_t bits = int_or(w, "num_bits", 0);
        if (!json_is_object(w)) {
            snprintf(what, sizeof what, "compressed-tensors group %s without weights", gname);
            return refuse(err, path, what);
        }
        if (json_is_false(json_object_get(w, "symmetric"))) {
            snprintf(what, sizeof what, "compressed-tensors %s weights are asymmetric", format);
            return refuse(err, path, what);
        }
        if (strcmp(actorder, "group") == 0) {
            snprintf(what, sizeof what, "compressed-tensors actorder 'group' (a permuted "
                     "weight_g_idx)");
            return refuse(err, path, what);
        }
        if (strcmp(type, "float") == 0 && bits == 8 && strcmp(format, "float-quantized") == 0) {
            q->method = VLMD_QUANT_CT_FP8;
            q->bits = 8;
            const json_t *bs = json_object_get(w, "block_structure");
            if (strcmp(strategy, "block") == 0) {
                int64_t r = json_integer_value(json_array_get(bs, 0)),
                        c = json_integer_value(json_array_get(bs, 1));
                if (r <= 0 || c <= 0 || r > 4096 || c > 4096) {
                    snprintf(what, sizeof what, "compressed-tensors block strategy without a "
                             "block_structure");
                    return refuse(err, path, what);
                }
                q->block[0] = (int)r, q->block[1] = (int)c;
            } else if (strcmp(strategy, "channel") != 0 && strcmp(strategy, "tensor") != 0) {
                snprintf(what, sizeof what, "compressed-tensors fp8 weights of strategy '%s' "
                         "(channel, tensor or block)", strategy);
                return refuse(err, path, what);
            }
        } else if (strcmp(type, "int") == 0 && bits == 4 &&
                   strcmp(format, "pack-quantized") == 0) {
            q->method = VLMD_QUANT_CT_INT4;
            q->bits = 4;
            q->group_size = strcmp(strategy, "group") == 0 ? (int)int_or(w, "group_size", 0)
                            : strcmp(strategy, "channel") == 0 ? -1
                                                               : 0;
            if (q->group_size == 0 || q->group_size < -1 || q->group_size % 8) {
                snprintf(what, sizeof what, "compressed-tensors int4 strategy '%s' group_size "
                         "%lld", strategy, (long long)int_or(w, "group_size", 0));
                return refuse(err, path, what);
            }
        } else {
            snprintf(what, sizeof what, "compressed-tensors format '%s' with %s %lld-bit weights",
                     format, type, (long long)bits);
            return refuse(err, path, what);
        }
    }
    return VLMD_OK;
}

static vlmd_status parse_int4(const json_t *qc, const char *method, const char *path,
                              vlmd_quant_config *q, vlmd_error *err)
{
    char what[200];
    int64_t bits = int_or(qc, "bits", int_or(qc, "w_bit", 0)),
            group = int_or(qc, "group_size", int_or(qc, "q_group_size", 0));
    if (bits != 4) {
        snprintf(what, sizeof what, "%s with %lld-bit weights (4 only)", method, (long long)bits);
        return refuse(err, path, what);
    }
    q->bits = 4;
    q->group_size = (int)group;
    if (group != -1 && (group <= 0 || group % 8)) {
        snprintf(what, sizeof what, "%s group_size %lld", method, (long long)group);
        return refuse(err, path, what);
    }
    if (strcmp(method, "awq") == 0) {
        const char *version = str_or(qc, "version", "gemm");
        if (strcasecmp(version, "gemm") != 0) {
            snprintf(what, sizeof what, "awq version '%s' (gemm's layout only)", version);
            return refuse(err, path, what);
        }
        if (json_is_false(json_object_get(qc, "zero_point"))) {
            snprintf(what, sizeof what, "awq without zero points");
            return refuse(err, path, what);
        }
        q->method = VLMD_QUANT_AWQ;
        return VLMD_OK;
    }
    const char *format = str_or(qc, "checkpoint_format", "gptq");
    if (strcmp(format, "gptq") != 0 && strcmp(format, "gptq_v2") != 0) {
        snprintf(what, sizeof what, "gptq checkpoint_format '%s' (gptq or gptq_v2)", format);
        return refuse(err, path, what);
    }
    q->method = VLMD_QUANT_GPTQ;
    q->gptq_v2 = strcmp(format, "gptq_v2") == 0;
    return VLMD_OK;
}

static vlmd_status parse_kv_scheme(const json_t *qc, const char *path, vlmd_quant_config *q,
                                   vlmd_error *err)
{
    const json_t *kv = json_object_get(qc, "kv_cache_scheme");
    if (!kv || json_is_null(kv))
        return VLMD_OK;
    const char *type = str_or(kv, "type", ""), *strategy = str_or(kv, "strategy", "tensor");
    if (strcmp(type, "float") != 0 || int_or(kv, "num_bits", 0) != 8 ||
        strcmp(strategy, "tensor") != 0) {
        char what[160];
        snprintf(what, sizeof what, "kv_cache_scheme %s %lld-bit per %s (8-bit float per tensor "
                 "only)", type, (long long)int_or(kv, "num_bits", 0), strategy);
        return refuse(err, path, what);
    }
    q->kv_fp8 = true;
    return VLMD_OK;
}

vlmd_status vlmd_quant_config_parse(const json_t *root, const char *path,
                                    vlmd_quant_config *out, vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    const json_t *qc = json_object_get(root, "quantization_config");
    if (!qc) {
        const json_t *text = json_object_get(root, "text_config");
        qc = json_object_get(text, "quantization_config");
    }
    if (!qc || json_is_null(qc))
        return VLMD_OK;
    if (!json_is_object(qc))
        return refuse(err, path, "is not an object");
    const char *method = str_or(qc, "quant_method", "");
    char what[160];
    vlmd_status s;
    if (strcmp(method, "fp8") == 0)
        s = parse_fp8(qc, path, out, err);
    else if (strcmp(method, "compressed-tensors") == 0)
        s = parse_ct(qc, path, out, err);
    else if (strcmp(method, "awq") == 0 || strcmp(method, "gptq") == 0)
        s = parse_int4(qc, method, path, out, err);
    else {
        snprintf(what, sizeof what, "quant_method '%s'", method);
        return refuse(err, path, what);
    }
    if (s == VLMD_OK)
        s = parse_kv_scheme(qc, path, out, err);
    if (s != VLMD_OK)
        memset(out, 0, sizeof *out);
    return s;
}

const char *vlmd_quant_name(const vlmd_quant_config *q, char *buf, size_t len)
{
    switch (q->method) {
    case VLMD_QUANT_NONE:
        snprintf(buf, len, "none");
        break;
    case VLMD_QUANT_FP8:
    case VLMD_QUANT_CT_FP8:
        if (q->block[0])
            snprintf(buf, len, "fp8 e4m3, %dx%d block scales", q->block[0], q->block[1]);
        else
            snprintf(buf, len, "fp8 e4m3, channel scales");
        break;
    case VLMD_QUANT_CT_INT4:
    case VLMD_QUANT_AWQ:
    case VLMD_QUANT_GPTQ: {
        const char *m = q->method == VLMD_QUANT_AWQ    ? "awq"
                        : q->method == VLMD_QUANT_GPTQ ? (q->gptq_v2 ? "gptq v2" : "gptq")
                                                       : "compressed-tensors";
        if (q->group_size > 0)
            snprintf(buf, len, "%s int4, groups of %d", m, q->group_size);
        else
            snprintf(buf, len, "%s int4, channel scales", m);
        break;
    }
    }
    return buf;
}
