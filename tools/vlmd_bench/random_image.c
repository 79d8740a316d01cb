/* random_image.c - random PNG images as data: URIs (libpng, OpenSSL's base64). */
#include "random_image.h"

#include <openssl/evp.h>
#include <png.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "rng.h"

static void on_png_bytes(png_structp png, png_bytep data, size_t n)
{
    if (vlmd_buf_append(png_get_io_ptr(png), data, n) != VLMD_OK)
        png_error(png, "out of memory");
}

static void no_flush(png_structp png)
{
    (void)png;
}

/* The PNG of rgb (width x height x 3), appended to out. */
static bool encode_png(const uint8_t *rgb, int width, int height, vlmd_buf *out)
{
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return false;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return false;
    }
    png_set_write_fn(png, out, on_png_bytes, no_flush);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < height; y++)
        png_write_row(png, rgb + (size_t)y * (size_t)width * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return true;
}

char *bench_random_image_uri(int width, int height, uint64_t *rng)
{
    enum { BLOCK = 14 };
    uint8_t *rgb = malloc((size_t)width * (size_t)height * 3);
    vlmd_buf png = VLMD_BUF_INIT;
    char *uri = NULL;
    if (!rgb)
        return NULL;
    int bw = (width + BLOCK - 1) / BLOCK, bh = (height + BLOCK - 1) / BLOCK;
    uint8_t *colors = malloc((size_t)bw * (size_t)bh * 3);
    if (colors) {
        for (size_t i = 0; i < (size_t)bw * (size_t)bh * 3; i++)
            colors[i] = (uint8_t)(bench_uniform(rng) * 256);
        for (int y = 0; y < height; y++)
            for (int x = 0; x < width; x++)
                memcpy(rgb + ((size_t)y * (size_t)width + (size_t)x) * 3,
                       colors + ((size_t)(y / BLOCK) * (size_t)bw + (size_t)(x / BLOCK)) * 3, 3);
    }
    if (colors && encode_png(rgb, width, height, &png)) {
        static const char head[] = "data:image/png;base64,";
        size_t n = sizeof head - 1 + 4 * ((png.len + 2) / 3) + 1;
        if ((uri = malloc(n))) {
            memcpy(uri, head, sizeof head - 1);
            EVP_EncodeBlock((unsigned char *)uri + sizeof head - 1, (const unsigned char *)png.data,
                            (int)png.len);
        }
    }
    free(colors);
    free(rgb);
    vlmd_buf_free(&png);
    return uri;
}
