/* qweight.h - a quantized weight matrix as the ops take it (ops.h qlinear,
 * moe_experts_q) and the CPU kernels read it (cpu_kernels.h dequant). */
#ifndef VLMD_QWEIGHT_H
#define VLMD_QWEIGHT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A quantized weight matrix W [out, in] in backend memory, in one layout
 * for every published format (the loader, llm_worker/lm_quant.c, repacks
 * them at load):
 *   FP8:  codes [out][in] e4m3 bytes (fp8.h); W[o][i] = e4m3(codes[o][i]) * s
 *   INT4: codes [out][in / 2] bytes, column 2j in the low nibble and 2j + 1
 *         in the high one, unsigned 0..15; W[o][i] = (q - z) * s, z the
 *         group's zero point (zeros NULL: 8, the symmetric formats)
 * s and z are those of row o / row_block and column group i / group:
 * scales [ceil(out / row_block)][groups] fp32, zeros alike as bytes, groups
 * = ceil(in / group) (the last group partial). group 0 is one group a row
 * (per-channel and per-tensor scales). row_block is 1 (a scale row per
 * weight row) or the checkpoint's block rows (FP8's 128x128 blocks, kept as
 * published when every stacked part starts on a block). The product is
 * dequantize-then-multiply: each weight in fp32 (one rounding), then as a
 * linear of fp32 weights (of the activations rounded through e4m3 first,
 * when act_group says so). */
typedef enum vlmd_qformat {
    VLMD_QFORMAT_NONE = 0,      /* not quantized: codes are the weight in the weight type */
    VLMD_QFORMAT_FP8,
    VLMD_QFORMAT_INT4,
} vlmd_qformat;

typedef struct vlmd_qweight {
    vlmd_qformat format;
    const void *codes;
    const float *scales;
    const uint8_t *zeros;       /* INT4 only; NULL: every zero point 8 */
    int group;                  /* columns per scale; 0: the whole row */
    int row_block;              /* rows per scale row (>= 1) */
    int act_group;              /* FP8 only, W8A8: each activation row quantized to e4m3 too,
                                 * per group of this many columns (-1: the whole row) with the
                                 * scale max(amax, 1e-10) / 448 in fp32, as the FP8 checkpoints
                                 * were calibrated for (vLLM's per_token_group_quant_fp8,
                                 * DeepSeek's act_quant); 0: weights only (W8A16) */
} vlmd_qweight;

/* Scale rows and groups of a w of `out` x `in`. */
static inline int vlmd_qweight_groups(const vlmd_qweight *w, int in)
{
    return w->group ? (in + w->group - 1) / w->group : 1;
}
static inline int vlmd_qweight_scale_rows(const vlmd_qweight *w, int out)
{
    return (out + w->row_block - 1) / w->row_block;
}
/* Bytes of a row of codes. */
static inline size_t vlmd_qweight_row_bytes(vlmd_qformat f, int in)
{
    return f == VLMD_QFORMAT_INT4 ? (size_t)(in + 1) / 2 : (size_t)in;
}
/* The rows [row0, ...) of w, a matrix of `in` columns (row0 a multiple of
 * row_block): an expert's rows of a stacked tensor. */
static inline vlmd_qweight vlmd_qweight_rows(const vlmd_qweight *w, int row0, int in)
{
    vlmd_qweight r = *w;
    size_t g = (size_t)vlmd_qweight_groups(w, in), srow = (size_t)(row0 / w->row_block);
    r.codes = (const uint8_t *)w->codes + (size_t)row0 * vlmd_qweight_row_bytes(w->format, in);
    r.scales = w->scales + srow * g;
    r.zeros = w->zeros ? w->zeros + srow * g : NULL;
    return r;
}

#ifdef __cplusplus
}
#endif

#endif
