/* fuzz_image.c - libFuzzer target: any bytes as an image, through vlmd's
 * wrapper of libpng, libjpeg-turbo and libwebp (header probe, then decode
 * under a pixel limit) and, when it decodes, the Qwen2-VL preprocessing. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "image.h"
#include "preprocess.h"

#define MAX_PIXELS (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vlmd_image_format fmt;
    uint32_t w = 0, h = 0;
    bool probed = vlmd_image_probe(data, size, &fmt, &w, &h, NULL) == VLMD_OK;
    vlmd_image img = {0};
    if (vlmd_image_decode(data, size, MAX_PIXELS, &img, NULL) != VLMD_OK)
        return 0;
    if (!probed || (uint64_t)img.width * img.height > MAX_PIXELS || !img.rgb)
        abort(); /* what decodes was probed, and within the limit */
    vlmd_vision_params p = {14, 2, 2, 56 * 56, 28 * 28 * 64, {0.5f, 0.5f, 0.5f},
                            {0.5f, 0.5f, 0.5f}, 1.0f / 255.0f};
    vlmd_pixel_values pv = {0};
    if (vlmd_preprocess(&p, &img, &pv, NULL) == VLMD_OK)
        vlmd_pixel_values_free(&pv);
    vlmd_image_free(&img);
    return 0;
}
