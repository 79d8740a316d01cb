/* fp8.h - FP8 E4M3 ("e4m3fn", the checkpoints' float8_e4m3fn): 1 sign bit,
 * 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111,
 * largest finite +-448 (0x7e), subnormals m * 2^-9. Decoding is exact in
 * fp32; encoding rounds to nearest even and saturates to +-448 (CUDA's
 * __NV_SATFINITE, what every quantizer the checkpoints come from does before
 * its cast), NaN stays NaN. Host and device code alike (no libm; under
 * nvcc both functions are __host__ __device__). */
#ifndef VLMD_FP8_H
#define VLMD_FP8_H

#include <stdint.h>
#include <string.h>

#define VLMD_E4M3_MAX 448.0f

/* callable from CUDA kernels too */
#ifdef __CUDACC__
#define VLMD_FP8_FN __host__ __device__ static inline
#else
#define VLMD_FP8_FN static inline
#endif

VLMD_FP8_FN float vlmd_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24, e = (c >> 3) & 15, m = c & 7, bits;
    if (e == 15 && m == 7) {
        bits = sign | 0x7fc00000u;              /* NaN */
    } else if (e) {
        bits = sign | (e + 120) << 23 | m << 20; /* 2^(e-7) (1 + m/8) */
    } else {                                    /* zero or m * 2^-9, exact */
        float f = (float)m * (1.0f / 512.0f);
        return c & 0x80 ? -f : f;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

VLMD_FP8_FN uint8_t vlmd_f32_to_e4m3(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint8_t sign = (uint8_t)(u >> 24 & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return sign | 0x7f;                     /* NaN */
    if (u >= 0x43e00000u)                       /* >= 448 (and inf): saturate */
        return sign | 0x7e;
    if (u < 0x3c800000u) {                      /* below 2^-6: subnormal steps of 2^-9 */
        float a, q;
        memcpy(&a, &u, sizeof a);
        q = a * 512.0f;                         /* exact: a power of two */
        uint32_t n = (uint32_t)q;
        float rest = q - (float)n;
        if (rest > 0.5f || (rest == 0.5f && (n & 1)))
            n++;
        return sign | (uint8_t)n;               /* n == 8 is the smallest normal's code */
    }
    /* normal: keep 3 mantissa bits, round to nearest even on the 20 dropped */
    uint32_t r = u + 0x7ffffu + ((u >> 20) & 1);
    uint32_t e = (r >> 23) - 120, m = (r >> 20) & 7;
    if (e > 15 || (e == 15 && m == 7))
        return sign | 0x7e;
    return sign | (uint8_t)(e << 3 | m);
}

#endif
