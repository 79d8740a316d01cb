/* tokenizer.h - Hugging Face tokenizer.json BPE: byte-level (Qwen, GLM) and
 * SentencePiece-style with byte fallback (Mixtral, Llama 2, Mistral; see
 * tokenizer_sp.c).
 *
 * Encoding: added tokens are split out first (longest match; special ones
 * only where the text is trusted, see vlmd_special); the rest goes through
 * the pre-tokenizer's Split regex (PCRE2, UTF + Unicode properties, JIT when
 * available), each piece's bytes through the byte-level alphabet, then
 * ranked BPE merges (a heap, so long pieces stay n log n).
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

/* Which added tokens written in a text become their ids. Special ones
 * ("special": true in tokenizer.json: <|im_start|>, <|endoftext|>,
 * <|image_pad|>, ...) only where the text is trusted; elsewhere their
 * characters are ordinary text, as Hugging Face's split_special_tokens=True
 * has it. Non-special added tokens (Qwen's <tool_call>, <think>) are ids in
 * both, as there too. */
typedef enum vlmd_special {
    VLMD_SPECIAL_SPLIT,     /* text from a request */
    VLMD_SPECIAL_MATCH,     /* text the server writes: a chat template's markers */
} vlmd_special;

/* Appends the ids of text[0..len) to out. Fails only on allocation failure
 * (invalid UTF-8 is tokenized byte-wise). Thread-safe: a loaded tokenizer is
 * read-only, every call has its own scratch. Its work grows as n log n with
 * the text's length at worst, a run of one character included. */
vlmd_status vlmd_tokenizer_encode(const vlmd_tokenizer *tok, const char *text, size_t len,
                                  vlmd_special special, vlmd_tokens *out);

/* Pre-tokens of at least this many bytes are merged from buckets of pairs by
 * rank instead of one heap of every pair: the same ids, in linear time on a
 * run of one character. */
#define VLMD_TOKENIZER_LONG_PIECE 64

/* Sets that length (tests compare the two ways with 1 and SIZE_MAX). */
void vlmd_tokenizer_set_long_piece(vlmd_tokenizer *tok, size_t bytes);

/* Text put together from pieces of both kinds, a chat template's markers and
 * a request's text, tokenized as one: added tokens are looked for within each
 * piece by its own rule, and the text between the ids found is one run across
 * piece boundaries, so a prompt whose request text holds no special token
 * gets the ids of the rendered text (what Hugging Face's apply_chat_template
 * gives). */
typedef struct vlmd_prompt_piece {
    size_t end;             /* the piece is text[previous end, end) */
    vlmd_special special;
} vlmd_prompt_piece;

typedef struct vlmd_prompt_text {
    vlmd_buf text;
    vlmd_prompt_piece *pieces;  /* owned; adjacent pieces differ in kind */
    size_t n_pieces, cap;
} vlmd_prompt_text;

#define VLMD_PROMPT_TEXT_INIT {VLMD_BUF_INIT, NULL, 0, 0}

/* Appends s[0..len) (or the string s) as a piece of the given kind; on
 * failure p keeps its earlier contents. */
vlmd_status vlmd_prompt_add(vlmd_prompt_text *p, vlmd_special special, const char *s, size_t len);
vlmd_status vlmd_prompt_puts(vlmd_prompt_text *p, vlmd_special special, const char *s);
/* Appends src's pieces, each of its own kind. */
vlmd_status vlmd_prompt_append(vlmd_prompt_text *p, const vlmd_prompt_text *src);
void vlmd_prompt_free(vlmd_prompt_text *p);     /* accepts an empty one */

/* Appends the ids of p's text to out (see vlmd_prompt_text). */
vlmd_status vlmd_tokenizer_encode_prompt(const vlmd_tokenizer *tok, const vlmd_prompt_text *p,
                                         vlmd_tokens *out);

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
/* The special ids the tokenizer's post-processor puts around one sequence
 * when asked to add special tokens (Hugging Face's add_special_tokens=True:
 * Mixtral's <s> before, Qwen3-Embedding's <|endoftext|> after; none for
 * Qwen's chat models). vlmd_tokenizer_encode never adds them: a chat
 * template writes its own. */
void vlmd_tokenizer_frame(const vlmd_tokenizer *tok, const uint32_t **prefix, size_t *n_prefix,
                          const uint32_t **suffix, size_t *n_suffix);
/* One past the largest id. */
uint32_t vlmd_tokenizer_size(const vlmd_tokenizer *tok);
bool vlmd_tokenizer_is_special(const vlmd_tokenizer *tok, uint32_t id);

/* Streaming detokenization for one sequence (zeroed, then skip_special set):
 * the stream's text is, piece after piece, the whole decode's. */
#define VLMD_DETOK_RUN 64
typedef struct vlmd_detok {
    uint8_t pending[VLMD_DETOK_RUN]; /* bytes of an incomplete UTF-8 character; a
                             * SentencePiece-style vocabulary's run of <0xXX> tokens (past
                             * VLMD_DETOK_RUN bytes a run is decided in parts) */
    int n_pending;
    bool skip_special;
    bool started;           /* text went out (the decoder's leading-space strip is over) */
    int strip_left;         /* leading spaces still to strip */
    uint32_t n_tokens;      /* tokens decoded (not skipped) */
} vlmd_detok;

/* Appends to out the text that token id completes (possibly none). */
vlmd_status vlmd_detok_push(vlmd_detok *d, const vlmd_tokenizer *tok, uint32_t id, vlmd_buf *out,
                            vlmd_error *err);
/* Ends the sequence: an incomplete character left over becomes U+FFFD (a
 * held byte run, its text or U+FFFD per byte). */
vlmd_status vlmd_detok_flush(vlmd_detok *d, const vlmd_tokenizer *tok, vlmd_buf *out);

#endif
