/* make_demo_model.c - `vlmd-make-demo-model DIR [--seed N]`: writes the demo
 * model (demo_model.h) that `make demo` serves. Exits 0 when DIR holds it
 * (written now or already there), 1 on failure (a DIR holding another
 * model is one), 2 on bad arguments. */
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "demo_model.h"

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long long seed = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: vlmd-make-demo-model DIR [--seed N]\n"
                   "Writes a small random-weight Qwen2-VL model (BF16, learned byte-level BPE) "
                   "into DIR;\nthe same seed (default 0) gives the same bytes, and a DIR that "
                   "already holds it is left as is.\n");
            return 0;
        }
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            if (vlmd_parse_i64(argv[++i], 0, 1LL << 62, &seed) != VLMD_OK) {
                fprintf(stderr, "vlmd-make-demo-model: --seed: '%s' is not a non-negative "
                                "integer\n", argv[i]);
                return 2;
            }
        } else if (!dir && argv[i][0] != '-') {
            dir = argv[i];
        } else {
            fprintf(stderr, "usage: vlmd-make-demo-model DIR [--seed N]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: vlmd-make-demo-model DIR [--seed N]\n");
        return 2;
    }
    bool unchanged = false;
    vlmd_error err = {0};
    if (vlmd_demo_model_write(dir, (uint64_t)seed, &unchanged, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-make-demo-model: %s\n", err.msg);
        return 1;
    }
    printf("%s: demo model %s (seed %lld)\n", dir, unchanged ? "already there" : "written", seed);
    return 0;
}
