/* image.h - encoded images (PNG, JPEG, WebP) to 8-bit RGB, as PIL's
 * convert("RGB") gives them: grey, palette and 16-bit widened or narrowed,
 * alpha dropped, CMYK inverted as Adobe writes it. The size is read from the
 * header and checked against max_pixels before any pixel is decoded, so a
 * decompression bomb is refused before it allocates. A decode is complete or
 * refused: truncated or corrupt data, a decoded size other than the header's,
 * a JPEG too short for the size it claims and animated WebP are errors. */
#ifndef VLMD_IMAGE_H
#define VLMD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum vlmd_image_format {
    VLMD_IMAGE_PNG,
    VLMD_IMAGE_JPEG,
    VLMD_IMAGE_WEBP,
} vlmd_image_format;

typedef struct vlmd_image {
    uint32_t width, height;
    uint8_t *rgb;           /* width * height * 3, row-major; owned */
} vlmd_image;

/* "PNG", "JPEG" or "WebP". */
const char *vlmd_image_format_str(vlmd_image_format format);

/* The format and size from the header alone. VLMD_ERR_INVALID_ARG for an
 * unknown format, a broken header, an animated WebP, a JPEG coding other
 * than Huffman or a JPEG whose bytes are too few for the size it claims
 * (*format is set whenever the format is known). */
vlmd_status vlmd_image_probe(const void *data, size_t len, vlmd_image_format *format,
                             uint32_t *width, uint32_t *height, vlmd_error *err);
/* Decodes to RGB. VLMD_ERR_TOO_LARGE (before decoding) when width * height >
 * max_pixels; VLMD_ERR_INVALID_ARG for what the probe refuses, corrupt or
 * truncated data (a JPEG stops at its first warning) or a decoded size other
 * than the header's. On failure *out holds nothing. */
vlmd_status vlmd_image_decode(const void *data, size_t len, uint64_t max_pixels, vlmd_image *out,
                              vlmd_error *err);
void vlmd_image_free(vlmd_image *img);

#endif
