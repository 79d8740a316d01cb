/* fuzz_schema.c - libFuzzer target: any bytes as a JSON Schema to the
 * compiler. A schema it takes must give a grammar whose shortest
 * completion is real: from the start, some byte always shortens it by
 * exactly one until the output is complete, and that output is JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "structured.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vlmd_grammar_options opt = {.compact = size & 1};
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    if (vlmd_grammar_compile_schema((const char *)data, size, &opt, &g, &err) != VLMD_OK) {
        if (g || !err.msg[0] || err.msg[0] != '#')
            abort();    /* a failure leaves nothing, and says where */
        return 0;
    }
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    size_t need = vlmd_grammar_min_completion(g, &st);
    if (need > 4096) {  /* long minimum lengths: too slow to follow here */
        vlmd_grammar_free(g);
        return 0;
    }
    char *out = malloc(need + 1);
    for (size_t k = 0; k < need; k++) {
        if (!vlmd_grammar_state_alive(&st) || vlmd_grammar_min_completion(g, &st) != need - k)
            abort();
        bool moved = false;
        for (int b = 0; b < 256 && !moved; b++) {
            vlmd_grammar_state c = st;
            uint8_t byte = (uint8_t)b;
            if (vlmd_grammar_accept_bytes(g, &c, &byte, 1) &&
                vlmd_grammar_min_completion(g, &c) == need - k - 1) {
                st = c;
                out[k] = (char)byte;
                moved = true;
            }
        }
        if (!moved)
            abort();
    }
    if (!vlmd_grammar_is_complete(g, &st))
        abort();
    json_error_t je;
    json_t *v = json_loadb(out, need, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v && strstr(je.text, "too big"))
        v = json_loadb(out, need, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!v)
        abort();    /* the shortest output is not JSON */
    json_decref(v);
    free(out);
    vlmd_grammar_free(g);
    return 0;
}
