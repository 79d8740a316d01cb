/* mrope.c - M-RoPE positions and image-pad expansion (see mrope.h). */
#include "mrope.h"

#include <stdlib.h>

vlmd_status vlmd_mrope_positions(const uint32_t *ids, size_t n, uint32_t image_token_id,
                                 const vlmd_image_grid *grids, size_t n_images, uint32_t merge,
                                 int32_t *positions, int32_t *next, vlmd_error *err)
{
    int32_t *t = positions, *h = positions + n, *w = positions + 2 * n;
    int32_t st = 0; /* the next text position */
    size_t img = 0;
    for (size_t i = 0; i < n;) {
        if (ids[i] != image_token_id) {
            t[i] = h[i] = w[i] = st++;
            i++;
            continue;
        }
        if (img == n_images)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "more images in the prompt than the "
                               "%zu given", n_images);
        const vlmd_image_grid *g = &grids[img++];
        uint32_t gh = g->h / merge, gw = g->w / merge;
        size_t count = (size_t)g->t * gh * gw;
        if (i + count > n)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "image %zu needs %zu tokens; the prompt "
                               "ends first", img - 1, count);
        int32_t top = st;
        for (size_t k = 0; k < count; k++) {
            if (ids[i + k] != image_token_id)
                return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "image %zu has %zu tokens in the "
                                   "prompt, not %zu", img - 1, k, count);
            int32_t tt = (int32_t)(k / ((size_t)gh * gw)), hh = (int32_t)(k / gw % gh),
                    ww = (int32_t)(k % gw);
            t[i + k] = st + tt;
            h[i + k] = st + hh;
            w[i + k] = st + ww;
            int32_t m = t[i + k] > h[i + k] ? t[i + k] : h[i + k];
            m = m > w[i + k] ? m : w[i + k];
            top = m > top ? m : top;
        }
        st = top + 1;
        i += count;
    }
    if (img != n_images)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%zu images given, %zu in the prompt",
                           n_images, img);
    *next = st;
    return VLMD_OK;
}

vlmd_status vlmd_expand_image_pads(const uint32_t *ids, size_t n, uint32_t image_token_id,
                                   const uint32_t *counts, size_t n_images, uint32_t **out,
                                   size_t *out_n, vlmd_error *err)
{
    size_t total = n, found = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == image_token_id) {
            if (found == n_images)
                return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "more image tokens than the %zu "
                                   "images", n_images);
            total += (size_t)counts[found++] - 1;
        }
    if (found != n_images)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%zu image tokens for %zu images", found,
                           n_images);
    uint32_t *o = malloc((total ? total : 1) * sizeof *o);
    if (!o)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    size_t k = 0, img = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != image_token_id) {
            o[k++] = ids[i];
            continue;
        }
        for (uint32_t c = 0; c < counts[img]; c++)
            o[k++] = image_token_id;
        img++;
    }
    *out = o;
    *out_n = total;
    return VLMD_OK;
}
