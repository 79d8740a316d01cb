/* random_image.h - the images vlmd-bench attaches to chat prompts (--image-ratio):
 * W x H PNGs of random 14 x 14 blocks (one ViT patch each), so that every
 * image is new to the server's embedding cache, as data: URIs. */
#ifndef VLMD_BENCH_RANDOM_IMAGE_H
#define VLMD_BENCH_RANDOM_IMAGE_H

#include <stdint.h>

/* "data:image/png;base64,..." (the caller frees it), or NULL when out of memory. */
char *bench_random_image_uri(int width, int height, uint64_t *rng);

#endif
