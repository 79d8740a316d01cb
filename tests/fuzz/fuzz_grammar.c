/* fuzz_grammar.c - libFuzzer target: a fixed set of grammars (schemas,
 * any object, a choice, a regex) driven by arbitrary bytes over a small
 * synthetic vocabulary. The first byte picks the grammar; each next byte
 * either picks one of the tokens the mask allows (which accept must take)
 * or is fed to the automaton as a raw byte. At every state the mask must
 * equal token-by-token acceptance (brute force), never be empty, and set
 * the EOS bit exactly when the output is complete. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "structured.h"
#include "synth_vocab.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\","
    "\"minimum\":-3,\"maximum\":120},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\\\"\",1.5,null]},"
    "\"maxItems\":3}},\"required\":[\"name\"]}",
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\",\"exclusiveMinimum\":0.5},"
    "\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
    "{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^[a-f0-9]{2,4}(-x)?$\"},{\"type\":\"string\",\"format\":\"date\"},"
    "{\"type\":\"boolean\"},{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}]}",
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"format\":\"uuid\"},{\"const\":{\"k\":[true]}}],"
    "\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":2},\"minItems\":1}",
    NULL,   /* any JSON object */
};
#define N_SCHEMAS (sizeof schemas / sizeof *schemas)
#define N_GRAMMARS (N_SCHEMAS + 2)

static synth_vocab sv;
static vlmd_vocab *vocab;
static vlmd_grammar *grammars[N_GRAMMARS];
static vlmd_masker *maskers[N_GRAMMARS];
static vlmd_mask_scratch *scratch;
static uint32_t eos;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (!synth_vocab_make(512, 2, 99, &sv) ||
        vlmd_vocab_create(sv.n, (const uint8_t *const *)sv.bytes, sv.lens, &vocab, NULL) != VLMD_OK)
        abort();
    eos = sv.n - 2;
    for (size_t i = 0; i < N_SCHEMAS; i++) {
        vlmd_status st = schemas[i]
                             ? vlmd_grammar_compile_schema(schemas[i], strlen(schemas[i]), NULL, &grammars[i], NULL)
                             : vlmd_grammar_compile_json_object(NULL, &grammars[i], NULL);
        if (st != VLMD_OK)
            abort();
    }
    const char *choices[] = {"red", "green", "greenish blue"};
    size_t lens[] = {3, 5, 13};
    const char *re = "([A-Z][a-z]+ ?){1,3}[.!?]|\\d+(\\.\\d\\d)?";
    if (vlmd_grammar_compile_choice(choices, lens, 3, &grammars[N_SCHEMAS], NULL) != VLMD_OK ||
        vlmd_grammar_compile_regex(re, strlen(re), &grammars[N_SCHEMAS + 1], NULL) != VLMD_OK)
        abort();
    for (size_t i = 0; i < N_GRAMMARS; i++)
        if (vlmd_masker_create(grammars[i], vocab, &maskers[i], NULL) != VLMD_OK)
            abort();
    scratch = vlmd_mask_scratch_create();
    return 0;
}

/* The mask at st against brute force; returns how many tokens it allows. */
static uint32_t check(const vlmd_grammar *g, vlmd_masker *m, const vlmd_grammar_state *st, uint32_t *mask,
                      size_t n_words)
{
    if (vlmd_masker_fill(m, st, &eos, 1, mask, n_words, scratch, NULL) != VLMD_OK)
        abort();
    uint32_t allowed = 0;
    for (uint32_t id = 0; id < n_words * 32; id++) {
        bool bit = mask[id / 32] >> (id % 32) & 1, ok;
        if (id == eos)
            ok = vlmd_grammar_is_complete(g, st);
        else if (id >= sv.n)
            ok = false;
        else {
            vlmd_grammar_state c;
            memcpy(c.w, st->w, st->w[0] * sizeof st->w[0]);
            ok = vlmd_masker_accept(m, &c, id);
        }
        if (bit != ok)
            abort();
        allowed += bit;
    }
    return allowed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    size_t gi = data[0] % N_GRAMMARS;
    const vlmd_grammar *g = grammars[gi];
    vlmd_masker *m = maskers[gi];
    size_t n_words = (sv.n + 31) / 32;
    uint32_t mask[(512 + 31) / 32];
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    for (size_t i = 1; i < size && i < 160; i++) {
        uint32_t allowed = check(g, m, &st, mask, n_words);
        if (!allowed)
            abort();    /* a live state always has a way on */
        if (data[i] >= 0xf0 && i + 1 < size) {
            /* a raw byte: taken or refused, the state stays alive */
            vlmd_grammar_accept_bytes(g, &st, &data[++i], 1);
            if (!vlmd_grammar_state_alive(&st))
                abort();
            continue;
        }
        uint32_t k = data[i] % allowed, id = 0;
        for (size_t w = 0; w < n_words; w++) {
            uint32_t c = (uint32_t)__builtin_popcount(mask[w]);
            if (k < c) {
                uint32_t x = mask[w];
                while (k--)
                    x &= x - 1;
                id = (uint32_t)(w * 32 + (uint32_t)__builtin_ctz(x));
                break;
            }
            k -= c;
        }
        if (id == eos)
            break;
        if (!vlmd_masker_accept(m, &st, id))
            abort();    /* the mask allowed it */
    }
    return 0;
}
