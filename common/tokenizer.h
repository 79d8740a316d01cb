/* tokenizer.h - Hugging Face tokenizer.json byte-level BPE (the Qwen family).
 *
 * Encoding: added/special tokens are split out first (longest match); the
 * rest goes through the pre-tokenizer's Split regex (PCRE2, UTF + Unicode
 * properties, JIT when available), each piece's bytes through the byte-level
 * alphabet, then ranked BPE merges (a heap, so long pieces stay n log n).
 * Decoding maps ids back to bytes; the streaming detokenizer emits text only
 * at UTF-8 boundaries, so a client never sees half a character. Invalid
 * UTF-8 decodes to U+FFFD, one per maximal invalid subpart, as Python's
 * errors="replace" does. A loaded tokenizer is read-only and thread-safe. */
#ifndef VLMD_TOKENIZER_H
#define VLMD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "status.h"

typedef struct vlmd_tokenizer vlmd_tokenizer;

/* A growable list of token ids. */
typedef struct vlmd_tokens {
    uint32_t *ids;
    size_t n, cap;
} vlmd_tokens;

vlmd_status vlmd_tokens_push(vlmd_tokens *t, uint32_t id);
void vlmd_tokens_free(vlmd_tokens *t);

/* Loads tokenizer.json. Unsupported models or pre-tokenizers are an error
 * naming what is unsupported. */
vlmd_status vlmd_tokenizer_load(const char *path, vlmd_tokenizer **out, vlmd_error *err);
void vlmd_tokenizer_free(vlmd_tokenizer *tok);

/* Appends the ids of text[0..len) to out. With parse_special, added tokens
 * written in the text become their ids; without, they are plain text.
 * Fails only on allocation failure (invalid UTF-8 is tokenized byte-wise). */
vlmd_status vlmd_tokenizer_encode(const vlmd_tokenizer *tok, const char *text, size_t len,
                                  bool parse_special, vlmd_tokens *out);

/* Appends the text of ids to out (specials as written unless skip_special).
 * An id outside the vocabulary is VLMD_ERR_INVALID_ARG naming it. */
vlmd_status vlmd_tokenizer_decode(const vlmd_tokenizer *tok, const uint32_t *ids, size_t n,
                                  bool skip_special, vlmd_buf *out, vlmd_error *err);

/* The id of a token written exactly so (an added token or a vocab entry in
 * its byte-level spelling); -1 when there is none. */
int64_t vlmd_tokenizer_find(const vlmd_tokenizer *tok, const char *token);
/* The raw bytes of one token (an added token's text as written); false for
 * an id outside the vocabulary. */
bool vlmd_tokenizer_token_bytes(const vlmd_tokenizer *tok, uint32_t id, const uint8_t **bytes,
                                size_t *len);
/* One past the largest id. */
uint32_t vlmd_tokenizer_size(const vlmd_tokenizer *tok);
bool vlmd_tokenizer_is_special(const vlmd_tokenizer *tok, uint32_t id);

/* Streaming detokenization for one sequence. */
typedef struct vlmd_detok {
    uint8_t pending[4];     /* bytes of an incomplete UTF-8 character */
    int n_pending;
    bool skip_special;
} vlmd_detok;

/* Appends to out the text that token id completes (possibly none). */
vlmd_status vlmd_detok_push(vlmd_detok *d, const vlmd_tokenizer *tok, uint32_t id, vlmd_buf *out,
                            vlmd_error *err);
/* Ends the sequence: an incomplete character left over becomes U+FFFD. */
vlmd_status vlmd_detok_flush(vlmd_detok *d, vlmd_buf *out);

#endif
