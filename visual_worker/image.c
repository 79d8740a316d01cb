/* image.c - PNG (libpng simplified API), JPEG (libjpeg-turbo) and WebP
 * (libwebp) decoding to RGB8 (see image.h). Every decoder reports errors as
 * a status; none may abort or longjmp past this file. The probe reads
 * headers only (the frontend calls it on every image); the decoders are
 * handed its size and refuse any other. */
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

/* ---- headers ----------------------------------------------------------------------- */

/* What a JPEG's markers say before its first scan. */
typedef struct jpeg_frame {
    uint32_t width, height;
    uint8_t sof;                /* the SOFn marker: 0xc0..0xcf */
    uint64_t min_blocks;        /* the fewest 8x8 blocks of any component */
    size_t scan_data;           /* offset of the first scan's entropy-coded data */
} jpeg_frame;

/* Walks the markers from SOI to the first SOS as libjpeg does (0xff fill
 * bytes skipped; anything else between segments is corrupt data). */
static vlmd_status jpeg_read_frame(const uint8_t *p, size_t len, jpeg_frame *f, vlmd_error *err)
{
    bool have_sof = false;
    size_t i = 2;
    while (i + 4 <= len) {
        if (p[i] != 0xff)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a corrupt JPEG: no marker at byte %zu",
                               i);
        uint8_t m = p[i + 1];
        if (m == 0xff || m == 0xd8 || m == 0x01 || (m >= 0xd0 && m <= 0xd7)) {
            i += m == 0xff ? 1 : 2;
            continue;
        }
        size_t seg = (size_t)p[i + 2] << 8 | p[i + 3];
        if (seg < 2 || i + 2 + seg > len)
            break;
        const uint8_t *s = p + i + 4;
        bool sof = m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc;
        if (sof && !have_sof) {
            uint32_t n = seg >= 8 ? s[5] : 0, hmax = 1, vmax = 1;
            if (n == 0 || seg != 8 + 3 * (size_t)n)
                return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG with a bad frame header");
            *f = (jpeg_frame){.height = (uint32_t)s[1] << 8 | s[2],
                              .width = (uint32_t)s[3] << 8 | s[4], .sof = m,
                              .min_blocks = UINT64_MAX};
            for (uint32_t c = 0; c < n; c++) {
                uint32_t h = s[7 + 3 * c] >> 4, v = s[7 + 3 * c] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4)
                    return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG with sampling "
                                       "factors %ux%u", h, v);
                hmax = h > hmax ? h : hmax;
                vmax = v > vmax ? v : vmax;
            }
            /* libjpeg's width_in_blocks and height_in_blocks of each component */
            for (uint32_t c = 0; c < n; c++) {
                uint64_t h = s[7 + 3 * c] >> 4, v = s[7 + 3 * c] & 15;
                uint64_t blocks = ((uint64_t)f->width * h + hmax * 8 - 1) / (hmax * 8) *
                                  (((uint64_t)f->height * v + vmax * 8 - 1) / (vmax * 8));
                f->min_blocks = blocks < f->min_blocks ? blocks : f->min_blocks;
            }
            have_sof = true;
        }
        if (m == 0xda) {
            if (!have_sof)
                break;
            f->scan_data = i + 2 + seg;
            return VLMD_OK;
        }
        if (m == 0xd9)
            break;
        i += 2 + seg;
    }
    if (!have_sof)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG without a readable size");
    return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG of %ux%u that ends before its image "
                       "data", f->width, f->height);
}

/* Checks what can be known before decoding: a coding libjpeg-turbo decodes
 * completely or refuses (Huffman: arithmetic coding fills a cut scan with
 * zeros, legally, so a truncation would go unseen), and enough bytes for
 * the size claimed: the first scan codes at least one bit per block of each
 * of its components, so a header's lie costs no more than its bytes. */
static vlmd_status jpeg_probe(const uint8_t *p, size_t len, uint32_t *w, uint32_t *h,
                              vlmd_error *err)
{
    jpeg_frame f = {0};
    vlmd_status st = jpeg_read_frame(p, len, &f, err);
    if (st != VLMD_OK)
        return st;
    *w = f.width;
    *h = f.height;
    if (f.sof > 0xc2)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG coded as SOF%u (arithmetic, "
                           "lossless or hierarchical) is not supported: only baseline, extended "
                           "and progressive Huffman coding", (unsigned)(f.sof - 0xc0));
    if (!f.width || !f.height)
        return VLMD_OK; /* the caller refuses a zero size */
    uint64_t need = (f.min_blocks + 7) / 8;
    if (len - f.scan_data < need)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG whose header says %ux%u but "
                           "whose %zu bytes of image data cannot hold that many pixels (at "
                           "least %llu bytes)", f.width, f.height, len - f.scan_data,
                           (unsigned long long)need);
    return VLMD_OK;
}

/* Refuses animated WebP from its VP8X header: the simple decoder reads one
 * still image only. */
static vlmd_status webp_probe(const uint8_t *p, size_t len, uint32_t *w, uint32_t *h,
                              vlmd_error *err)
{
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(p, len, &f) != VP8_STATUS_OK)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a WebP without a readable size");
    *w = (uint32_t)f.width;
    *h = (uint32_t)f.height;
    if (f.has_animation)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "an animated WebP (%ux%u): animated images "
                           "are not supported, send one frame as a still image", *w, *h);
    return VLMD_OK;
}

const char *vlmd_image_format_str(vlmd_image_format format)
{
    switch (format) {
    case VLMD_IMAGE_PNG:
        return "PNG";
    case VLMD_IMAGE_JPEG:
        return "JPEG";
    case VLMD_IMAGE_WEBP:
        return "WebP";
    }
    return "?";
}

vlmd_status vlmd_image_probe(const void *data, size_t len, vlmd_image_format *format,
                             uint32_t *width, uint32_t *height, vlmd_error *err)
{
    const uint8_t *p = data;
    vlmd_status st = VLMD_OK;
    *width = *height = 0;
    if (len >= 24 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 && memcmp(p + 12, "IHDR", 4) == 0) {
        *format = VLMD_IMAGE_PNG;
        *width = be32(p + 16);
        *height = be32(p + 20);
    } else if (len >= 4 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        *format = VLMD_IMAGE_JPEG;
        st = jpeg_probe(p, len, width, height, err);
    } else if (len >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) {
        *format = VLMD_IMAGE_WEBP;
        st = webp_probe(p, len, width, height, err);
    } else {
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "not a PNG, JPEG or WebP image");
    }
    if (st != VLMD_OK)
        return st;
    if (*width == 0 || *height == 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "an image of %ux%u pixels", *width, *height);
    return VLMD_OK;
}

/* ---- decoders: each refuses a size other than the header's before allocating ------ */

static vlmd_status decode_png(const uint8_t *p, size_t len, uint32_t w, uint32_t h,
                              vlmd_image *out, vlmd_error *err)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, p, len))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt PNG: %s", img.message);
    if (img.width != w || img.height != h) {
        png_image_free(&img);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a PNG that libpng reads as %ux%u, not "
                           "the %ux%u of its header", img.width, img.height, w, h);
    }
    /* With alpha (a channel or tRNS): read RGBA, then drop alpha as PIL's
     * convert("RGB") does (libpng's RGB would composite it instead). Without,
     * RGB is read as it is, with no buffer of four channels to copy from. */
    bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    img.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    size_t n = (size_t)w * h;
    uint8_t *rgba = alpha ? malloc(n * 4) : NULL;
    out->rgb = malloc(n * 3);
    if ((alpha && !rgba) || !out->rgb) {
        png_image_free(&img);
        free(rgba);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for a %ux%u image", w, h);
    }
    if (!png_image_finish_read(&img, NULL, alpha ? rgba : out->rgb, 0, NULL)) {
        free(rgba);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt or truncated PNG: %s",
                           img.message);
    }
    for (size_t i = 0; alpha && i < n; i++)
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

/* Every warning is an error: libjpeg warns for corrupt entropy data and for
 * data that ends early, then goes on with gray (a fake EOI), which would
 * make a lying header cost its full size. Trace messages are ignored. */
static void on_jpeg_message(j_common_ptr cinfo, int level)
{
    if (level < 0)
        on_jpeg_error(cinfo);
}

static vlmd_status decode_jpeg(const uint8_t *p, size_t len, uint32_t w, uint32_t h,
                               vlmd_image *out, vlmd_error *err)
{
    struct jpeg_decompress_struct cinfo;
    jpeg_failure fail;
    uint8_t *volatile row = NULL;
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = on_jpeg_error;
    fail.mgr.emit_message = on_jpeg_message;
    if (setjmp(fail.jump)) {
        uint32_t done = cinfo.output_scanline;
        jpeg_destroy_decompress(&cinfo);
        free(row);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt or truncated JPEG (stopped at "
                           "row %u of %u): %s", done, h, fail.message);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, p, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.image_width != w || cinfo.image_height != h) {
        jpeg_destroy_decompress(&cinfo);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a JPEG that libjpeg reads as %ux%u, not "
                           "the %ux%u of its header", cinfo.image_width, cinfo.image_height, w, h);
    }
    bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&cinfo);
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
        if (jpeg_read_scanlines(&cinfo, rows, 1) != 1)
            break; /* only a suspending source returns none; the check below refuses it */
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
    uint32_t done = cinfo.output_scanline;
    if (done == h)
        jpeg_finish_decompress(&cinfo); /* reads on to EOI: trailing damage is an error too */
    jpeg_destroy_decompress(&cinfo);
    free(row);
    if (done != h)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a truncated JPEG: %u of %u rows", done, h);
    return VLMD_OK;
}

static vlmd_status decode_webp(const uint8_t *p, size_t len, uint32_t w, uint32_t h,
                               vlmd_image *out, vlmd_error *err)
{
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config))
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "libwebp's decoder version differs");
    size_t n = (size_t)w * h * 3;
    out->rgb = malloc(n);
    if (!out->rgb)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for a %ux%u image", w, h);
    config.output.colorspace = MODE_RGB;
    config.output.is_external_memory = 1;
    config.output.u.RGBA = (WebPRGBABuffer){out->rgb, (int)w * 3, n};
    VP8StatusCode rc = WebPDecode(p, len, &config);
    WebPFreeDecBuffer(&config.output);
    if (rc != VP8_STATUS_OK)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "corrupt or truncated WebP (libwebp "
                           "status %d)", (int)rc);
    if ((uint32_t)config.output.width != w || (uint32_t)config.output.height != h)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a WebP that decodes to %dx%d, not the "
                           "%ux%u of its header", config.output.width, config.output.height, w, h);
    return VLMD_OK;
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
    st = fmt == VLMD_IMAGE_PNG    ? decode_png(data, len, w, h, out, err)
         : fmt == VLMD_IMAGE_JPEG ? decode_jpeg(data, len, w, h, out, err)
                                  : decode_webp(data, len, w, h, out, err);
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
