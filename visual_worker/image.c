/* image.c - PNG (libpng simplified API), JPEG (libjpeg-turbo) and WebP
 * (libwebp) decoding to RGB8 (see image.h). Every decoder reports errors as
 * a status; none may abort or longjmp past this file. */
#include "image.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The size of a JPEG from its first SOFn marker. */
static bool jpeg_size(const uint8_t *p, size_t len, uint32_t *w, uint32_t *h)
{
    size_t i = 2;
    while (i + 9 < len) {
        if (p[i] != 0xff)
            return false;
        uint8_t m = p[i + 1];
        if (m == 0xd8 || m == 0x01 || (m >= 0xd0 && m <= 0xd7)) {
            i += 2;
            continue;
        }
        size_t seg = (size_t)p[i + 2] << 8 | p[i + 3];
        bool sof = m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc;
        if (sof) {
            *h = (uint32_t)p[i + 5] << 8 | p[i + 6];
            *w = (uint32_t)p[i + 7] << 8 | p[i + 8];
            return *w && *h;
        }
        if (seg < 2)
            return false;
        i += 2 + seg;
    }
    return false;
}

vlmd_status vlmd_image_probe(const void *data, size_t len, vlmd_image_format *format,
                             uint32_t *width, uint32_t *height, vlmd_error *err)
{
    const uint8_t *p = data;
    if (len >= 24 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 && memcmp(p + 12, "IHDR", 4) == 0) {
        *format = VLMD_IMAGE_PNG;
        *width = be32(p + 16);
        *height = be32(p + 20);
    } else if (len >= 4 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        *format = VLMD_IMAGE_JPEG;
        if (!jpeg_size(p, len, width, height))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG without a readable size");
    } else if (len >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) {
        *format = VLMD_IMAGE_WEBP;
        int w = 0, h = 0;
        if (!WebPGetInfo(p, len, &w, &h))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a WebP without a readable size");
        *width = (uint32_t)w;
        *height = (uint32_t)h;
    } else {
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "not a PNG, JPEG or WebP image");
    }
    if (*width == 0 || *height == 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "an image of %ux%u pixels", *width, *height);
    return VLMD_OK;
}

static vlmd_status decode_png(const uint8_t *p, size_t len, vlmd_image *out, vlmd_error *err)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, p, len))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt PNG: %s", img.message);
    img.format = PNG_FORMAT_RGBA; /* then drop alpha, as PIL's convert("RGB") does */
    size_t n = (size_t)img.width * img.height;
    uint8_t *rgba = malloc(n * 4);
    out->rgb = malloc(n * 3);
    if (!rgba || !out->rgb) {
        png_image_free(&img);
        free(rgba);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for a %ux%u image", img.width,
                           img.height);
    }
    if (!png_image_finish_read(&img, NULL, rgba, 0, NULL)) {
        free(rgba);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt or truncated PNG: %s",
                           img.message);
    }
    for (size_t i = 0; i < n; i++)
        memcpy(out->rgb + 3 * i, rgba + 4 * i, 3);
    free(rgba);
    return VLMD_OK;
}

typedef struct jpeg_failure {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} jpeg_failure;

static void on_jpeg_error(j_common_ptr cinfo)
{
    jpeg_failure *f = (jpeg_failure *)cinfo->err;
    f->mgr.format_message(cinfo, f->message);
    longjmp(f->jump, 1); /* back into decode_jpeg, never further */
}

static void on_jpeg_warning(j_common_ptr cinfo)
{
    (void)cinfo; /* corrupt-data warnings: the decode goes on, as PIL's does */
}

static vlmd_status decode_jpeg(const uint8_t *p, size_t len, vlmd_image *out, vlmd_error *err)
{
    struct jpeg_decompress_struct cinfo;
    jpeg_failure fail;
    uint8_t *volatile row = NULL;
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = on_jpeg_error;
    fail.mgr.output_message = on_jpeg_warning;
    if (setjmp(fail.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt or truncated JPEG: %s",
                           fail.message);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, p, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    uint32_t w = cinfo.output_width, h = cinfo.output_height;
    int comps = cinfo.output_components;
    out->rgb = malloc((size_t)w * h * 3);
    row = malloc((size_t)w * (size_t)comps);
    if (!out->rgb || !row) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for a %ux%u image", w, h);
    }
    while (cinfo.output_scanline < h) {
        uint8_t *dst = out->rgb + (size_t)cinfo.output_scanline * w * 3;
        JSAMPROW rows[1] = {row};
        jpeg_read_scanlines(&cinfo, rows, 1);
        for (uint32_t x = 0; x < w; x++) {
            const uint8_t *s = row + (size_t)x * comps;
            if (cmyk) { /* Adobe's inverted CMYK, as PIL converts it */
                for (int c = 0; c < 3; c++)
                    dst[3 * x + c] = (uint8_t)(s[c] * s[3] / 255);
            } else {
                memcpy(dst + 3 * x, s, 3);
            }
        }
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    return VLMD_OK;
}

static vlmd_status decode_webp(const uint8_t *p, size_t len, vlmd_image *out, vlmd_error *err)
{
    int w = 0, h = 0;
    uint8_t *rgb = WebPDecodeRGB(p, len, &w, &h);
    if (!rgb)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt or truncated WebP");
    size_t n = (size_t)w * (size_t)h * 3;
    out->rgb = malloc(n);
    if (out->rgb)
        memcpy(out->rgb, rgb, n);
    WebPFree(rgb);
    return out->rgb ? VLMD_OK : vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for the image");
}

vlmd_status vlmd_image_decode(const void *data, size_t len, uint64_t max_pixels, vlmd_image *out,
                              vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    vlmd_image_format fmt;
    uint32_t w, h;
    vlmd_status st = vlmd_image_probe(data, len, &fmt, &w, &h, err);
    if (st != VLMD_OK)
        return st;
    if ((uint64_t)w * h > max_pixels)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "an image of %ux%u = %llu pixels; at most "
                           "%llu are accepted", w, h, (unsigned long long)w * h,
                           (unsigned long long)max_pixels);
    st = fmt == VLMD_IMAGE_PNG    ? decode_png(data, len, out, err)
         : fmt == VLMD_IMAGE_JPEG ? decode_jpeg(data, len, out, err)
                                  : decode_webp(data, len, out, err);
    if (st != VLMD_OK) {
        vlmd_image_free(out);
        return st;
    }
    out->width = w;
    out->height = h;
    return VLMD_OK;
}

void vlmd_image_free(vlmd_image *img)
{
    if (!img)
        return;
    free(img->rgb);
    memset(img, 0, sizeof *img);
}
