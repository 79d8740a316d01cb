/* cuda_bf16.h (tests/cuda_emu) - bfloat16 as CUDA's conversions define it:
 * round to nearest even (NaN to the canonical 0x7fff), or towards +inf. */
#ifndef VLMD_CUDA_EMU_BF16_H
#define VLMD_CUDA_EMU_BF16_H

#include <math.h>
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    unsigned short x;
};

static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __nv_bfloat16 __float2bfloat16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f))
        return __nv_bfloat16{0x7fff};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(unsigned short)(u >> 16)};
}

static inline __nv_bfloat16 __float2bfloat16_ru(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f))
        return __nv_bfloat16{0x7fff};
    unsigned short h = (unsigned short)(u >> 16);
    if ((u & 0xffffu) && !(u >> 31)) /* inexact and positive: one step up (to +inf at most) */
        h++;
    return __nv_bfloat16{h};
}

static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h)
{
    return h.x;
}

#endif
