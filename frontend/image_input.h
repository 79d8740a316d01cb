/* image_input.h - the images of a chat request, before the visual worker
 * sees them: where each comes from (a data: URI, or an http(s) URL whose host
 * --allowed-media-domains lists; never a file), its bytes, its size from the
 * header checked against the limits, its token count (the one shared
 * function, preprocess.h) and its content hash. Pixels are never decoded
 * here: that is the visual worker's, and a bad image found there comes back
 * as an error naming the image. */
#ifndef VLMD_IMAGE_INPUT_H
#define VLMD_IMAGE_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api_error.h"
#include "preprocess.h"

typedef struct image_limits {
    const vlmd_vision_params *params;   /* NULL: the model takes no images */
    uint64_t max_pixels;                /* --max-image-pixels */
    uint64_t max_bytes;                 /* --max-image-bytes */
    const char *allowed_domains;        /* --allowed-media-domains: "host,host" */
    int64_t fetch_timeout_ms;           /* --media-fetch-timeout-ms */
} image_limits;

typedef struct api_image {
    char param[64];             /* where the request gave it: "messages[0].content[1]" */
    char *url;                  /* owned, as given */
    char media_type[48];        /* a data URI's type, lowercased; "" when it declares none
                                   or application/octet-stream (the bytes decide) */
    bool remote;                /* an http(s) URL: to be fetched (blocking, off the loop) */
    uint8_t *data;              /* owned: the encoded image once resolved */
    size_t len;
    uint32_t width, height;     /* from the header */
    uint32_t grid_h, grid_w;    /* patches after the resize */
    uint32_t tokens;            /* image tokens in the prompt */
    uint32_t token_offset;      /* where they start, once the pads are expanded */
    uint8_t hash[32];           /* SHA-256 of the bytes */
} api_image;

/* A data: URI is decoded now; an http(s) URL is checked against the allowed
 * hosts and marked remote; anything else is a 400 naming the image. */
bool image_input_resolve(api_image *img, const image_limits *lim, api_error *e);

/* Fetches a remote image within the byte and time limits, following no
 * redirects. Blocks: call it on the thread pool. */
bool image_input_fetch(api_image *img, const image_limits *lim, api_error *e);

/* Reads the format and size from the header, checks them against a data
 * URI's declared type, the pixel limit and the aspect ratio, counts the
 * image's tokens and hashes its bytes. */
bool image_input_measure(api_image *img, const image_limits *lim, api_error *e);

void api_image_free(api_image *img);

/* Once per process, before any thread fetches (libcurl's global state). */
void image_input_global_init(void);

#endif
