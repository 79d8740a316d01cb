/* bench_vision.c - `vlmd-bench-vision MODEL_DIR [--device D] [--width W]
 * [--height H] [--iters N]`: the vision tower alone, in this process, on one
 * synthetic W x H image (default 1036 x 1036): preprocessing once, then the
 * tower and merger N times (after one warm-up); prints the median and the
 * fastest time. A benchmark, not a test; tools/device/bench-vision-7b.sh runs
 * it next to Hugging Face transformers on the same image shape. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "clock.h"
#include "config.h"
#include "preprocess.h"
#include "vision_tower.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    vlmd_config cfg; /* --device and --cuda-* */
    vlmd_config_init_defaults(&cfg);
    long long width = 1036, height = 1036, iters = 10;
    bool usage = false;
    for (int i = 1; i < argc && !usage; i++) {
        if (vlmd_backend_tool_flag(&cfg, argc, argv, &i))
            continue;
        else if (strcmp(argv[i], "--width") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 1 << 16, &width);
        else if (strcmp(argv[i], "--height") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 1 << 16, &height);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 10000, &iters);
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else
            usage = true;
    }
    if (!dir || usage) {
        fprintf(stderr, "usage: vlmd-bench-vision MODEL_DIR [--device auto|cpu|cuda] [--cuda-* as vlmd-llm] [--width W] "
                        "[--height H] [--iters N]\n");
        return 2;
    }
    vlmd_error err = {0};
    const vlmd_backend_options opts = vlmd_backend_options_of(&cfg);
    vlmd_model_config mc;
    vlmd_vision_params params;
    vlmd_backend *b = NULL;
    vlmd_safetensors *st = NULL;
    vision_tower *vt = NULL;
    vlmd_image img = {(uint32_t)width, (uint32_t)height, malloc((size_t)width * height * 3)};
    vlmd_pixel_values pv = {0};
    for (size_t i = 0; img.rgb && i < (size_t)width * height * 3; i++)
        img.rgb[i] = (uint8_t)((i * 2654435761u) >> 24);
    if (vlmd_model_config_load(dir, &mc, &err) != VLMD_OK ||
        vlmd_vision_params_configure(dir, 0, 0, &params, &err) != VLMD_OK ||
        vlmd_preprocess(&params, &img, &pv, &err) != VLMD_OK ||
        vlmd_backend_open(&opts, &b, &err) != VLMD_OK ||
        vlmd_safetensors_open_dir(dir, &st, &err) != VLMD_OK ||
        vision_tower_load(b, &mc, st, &vt, &err) != VLMD_OK ||
        vision_tower_reserve(vt, 1, pv.n_patches, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-vision: %s\n", err.msg);
        return 1;
    }
    vlmd_safetensors_close(st);
    uint32_t tokens = vision_tower_tokens(vt, &pv);
    float *out = malloc((size_t)tokens * vision_tower_token_features(vt) *
                        vision_tower_out_dim(vt) * sizeof *out);
    uint64_t *ns = malloc((size_t)(iters + 1) * sizeof *ns);
    for (long long i = 0; i <= iters; i++) { /* the first run warms up */
        uint64_t t0 = vlmd_now_ns();
        if (vision_tower_encode(vt, &pv, 1, out, &err) != VLMD_OK) {
            fprintf(stderr, "vlmd-bench-vision: %s\n", err.msg);
            return 1;
        }
        ns[i] = vlmd_now_ns() - t0;
    }
    qsort(ns + 1, (size_t)iters, sizeof *ns, cmp_u64);
    printf("vision %s on %s: %lldx%lld image -> %ux%u patches, %u tokens; encode median %.2f ms, "
           "fastest %.2f ms (%lld runs)\n",
           mc.architecture, vlmd_backend_info(b)->name, width, height, pv.grid_w, pv.grid_h,
           tokens, (double)ns[1 + iters / 2] / 1e6, (double)ns[1] / 1e6, iters);
    free(out);
    free(ns);
    vlmd_pixel_values_free(&pv);
    vlmd_image_free(&img);
    vision_tower_free(vt);
    vlmd_backend_destroy(b);
    return 0;
}
