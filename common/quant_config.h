/* quant_config.h - what config.json's quantization_config says about a
 * quantized checkpoint: which published format its linear weights are in,
 * and whether its KV cache is meant to be FP8. What each format's tensors
 * hold is read per tensor by the loader (llm_worker/lm_quant.c); this is the
 * whole model's word, checked once at start, so an unknown method or a
 * layout vlmd cannot serve is refused before anything loads. */
#ifndef VLMD_QUANT_CONFIG_H
#define VLMD_QUANT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum vlmd_quant_method {
    VLMD_QUANT_NONE = 0,        /* 16- or 32-bit weights */
    VLMD_QUANT_FP8,             /* "fp8" (Qwen, DeepSeek): e4m3 weights, 128x128 block scales
                                 * weight_scale_inv that multiply */
    VLMD_QUANT_CT_FP8,          /* compressed-tensors float-quantized: e4m3 weights,
                                 * weight_scale per channel, per tensor or per block */
    VLMD_QUANT_CT_INT4,         /* compressed-tensors pack-quantized: 4-bit symmetric groups,
                                 * q + 8 packed along the input dim */
    VLMD_QUANT_AWQ,             /* AutoAWQ "gemm": 4-bit groups with zero points, packed along
                                 * the output dim in AWQ's nibble order */
    VLMD_QUANT_GPTQ,            /* GPTQ 4-bit groups, packed along the input dim */
} vlmd_quant_method;

typedef struct vlmd_quant_config {
    vlmd_quant_method method;
    int bits;                   /* 8 (FP8) or 4 */
    int group_size;             /* 4-bit: inputs per scale (128) */
    int block[2];               /* FP8 blocks: [output rows, input columns] per scale (128, 128);
                                 * 0 0: per channel or per tensor, as each tensor's scale says */
    bool gptq_v2;               /* GPTQ's qzeros hold z (GPTQModel's gptq_v2); else z - 1 */
    bool kv_fp8;                /* kv_cache_scheme: an 8-bit float KV cache, per-tensor scales
                                 * (k_scale, v_scale) beside each layer's attention */
    bool fp8_activations;       /* not config.json's: --fp8-activations on, FP8 linears W8A8
                                 * (their inputs quantized per token and block of columns) */
} vlmd_quant_config;

/* Reads root's "quantization_config" (a jansson object; none: VLMD_QUANT_NONE).
 * A method or layout vlmd does not serve is VLMD_ERR_MODEL naming what was
 * found and what is supported (path names the file). */
struct json_t;
vlmd_status vlmd_quant_config_parse(const struct json_t *root, const char *path,
                                    vlmd_quant_config *out, vlmd_error *err);

/* "fp8 (128x128 blocks)", "awq int4 g128", ...: for logs and /memory_stats. */
const char *vlmd_quant_name(const vlmd_quant_config *q, char *buf, size_t len);

#define VLMD_QUANT_SUPPORTED                                                                   \
    "fp8 (e4m3 with 128x128 block scales), compressed-tensors float-quantized (fp8 per "     \
    "channel, tensor or block) and pack-quantized (int4 symmetric groups), awq (gemm, 4-bit), " \
    "gptq (4-bit, v1 or v2 zero points, without act-order)"

#endif
