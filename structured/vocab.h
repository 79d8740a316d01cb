/* vocab.h - struct vlmd_vocab, for the files of structured/ (callers see it
 * opaque through structured.h). */
#ifndef VLMD_VOCAB_H
#define VLMD_VOCAB_H

#include <stdbool.h>
#include <stdint.h>

#include "structured.h"

/* Printable ASCII but the quote and the backslash: the bytes a JSON string
 * reads as themselves (what a trie walk may accept a subtree of at once). */
static inline bool vocab_plain_byte(uint8_t b)
{
    return b >= 0x20 && b < 0x7f && b != '"' && b != '\\';
}

struct vlmd_vocab {
    uint32_t n;                 /* ids 0..n-1 */
    uint32_t n_words;           /* (n + 31) / 32 */
    uint32_t *off;              /* [n+1] token i is bytes[off[i]..off[i+1]) */
    uint8_t *bytes;
    uint32_t *text_bits;        /* [n_words] the text tokens (all others never allowed) */
    uint32_t max_len;           /* longest text token */
    /* the trie, nodes in preorder; node 0 is the root */
    uint32_t n_nodes;
    uint8_t *nbyte;             /* [n_nodes] the byte into the node */
    uint16_t *ndepth;           /* [n_nodes] its prefix's length */
    uint32_t *nend;             /* [n_nodes] first node after its subtree */
    uint8_t *nplain;            /* [n_nodes] 1: the subtree's bytes are all vocab_plain_byte */
    uint16_t *nmaxlen;          /* [n_nodes] the longest token in the subtree (0: none) */
    uint16_t *nown;             /* [n_nodes] tokens of exactly this prefix: ranks nrank[i].. */
    uint32_t *nrank;            /* [n_nodes+1] rank of the subtree's first token */
    uint32_t *rank_id;          /* [n_ranked] text tokens sorted by their bytes */
    uint32_t n_ranked;
};

#endif
