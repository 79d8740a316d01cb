/* synth_vocab.h - a synthetic byte-level BPE-like vocabulary for the
 * structured-output tests and benchmark: the 256 single bytes, then words
 * (many with a leading space), numbers, punctuation and JSON pieces,
 * whitespace runs, UTF-8 words and pieces that split UTF-8 characters, then
 * a few special (non-text) tokens at the end. Deterministic for a seed. */
#ifndef VLMD_SYNTH_VOCAB_H
#define VLMD_SYNTH_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct synth_vocab {
    uint32_t n;             /* ids 0..n-1; the last n_special are specials */
    uint32_t n_special;
    uint8_t **bytes;        /* [n] NULL for a special token */
    size_t *lens;           /* [n] */
} synth_vocab;

/* n tokens (n >= 256 + n_special); false when out of memory. */
bool synth_vocab_make(uint32_t n, uint32_t n_special, uint64_t seed, synth_vocab *out);
void synth_vocab_free(synth_vocab *v);

#endif
