/* fuzz_safetensors.c - libFuzzer target: any bytes as a safetensors file.
 * Either refused, or every tensor lies inside the bytes and can be widened. */
#include <stdint.h>
#include <stdlib.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vlmd_safetensors *st = NULL;
    if (vlmd_safetensors_open_memory(data, size, &st, NULL) != VLMD_OK)
        return 0;
    for (size_t i = 0; i < vlmd_safetensors_count(st); i++) {
        const vlmd_tensor_view *t = vlmd_safetensors_at(st, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size)
            abort();
        if (t->nbytes <= (1u << 20)) {
            float *f = malloc((size_t)vlmd_tensor_numel(t) * sizeof *f + 1);
            vlmd_tensor_to_f32(t, f, NULL); /* float types widen; the others refuse */
            free(f);
        }
    }
    vlmd_safetensors_close(st);
    return 0;
}
