/* tokenizer_impl.h - the tokenizer's insides, shared by its files:
 * tokenizer.c (loading, encoding, prompt text), tokenizer_sp.c (the
 * SentencePiece-style kind), bpe.c (the merges) and detok.c (decoding).
 * Nothing else includes it. */
#ifndef VLMD_TOKENIZER_IMPL_H
#define VLMD_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

typedef struct token_entry {
    uint8_t *bytes;         /* raw bytes (added tokens: their content; SentencePiece-style:
                             * the piece with its space marker as a space) */
    uint32_t len;
    bool special;
    bool added;
    bool raw_byte;          /* a byte-fallback token <0xXX>: bytes[0] is the byte */
} token_entry;

/* The two kinds of BPE tokenizer.json vlmd reads. */
typedef enum tok_kind {
    TOK_BYTE_LEVEL = 0,     /* GPT-2's byte-level alphabet, a Split regex (Qwen, GLM) */
    TOK_SENTENCEPIECE,      /* text symbols with a space marker (U+2581), byte fallback
                             * (Mixtral, Llama 2, Mistral) */
} tok_kind;

/* A normalizer step (SentencePiece-style), applied in order to each text
 * between added tokens. */
typedef enum norm_kind { NORM_NFC, NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct norm_step {
    norm_kind kind;
    char *from, *to;        /* owned: replace from by to; prepend to */
} norm_step;
#define TOK_MAX_NORMS 8
#define TOK_MAX_FRAME 4     /* special ids the post-processor puts around a sequence */

typedef struct added_token {
    const uint8_t *text;    /* borrowed from the entry */
    uint32_t len;
    uint32_t id;
    bool special;
} added_token;

/* Open addressing with linear probing; keys are (text, len) or a u64 pair. */
typedef struct str_slot {
    const char *key;
    uint32_t len;
    uint32_t id;
} str_slot;

typedef struct pair_slot {
    uint64_t key;           /* (left << 32) | right, +1 so that 0 means empty */
    uint32_t rank;
    uint32_t result;
} pair_slot;

struct vlmd_tokenizer {
    token_entry *tokens;    /* by id; ids the file skips have len 0 */
    uint32_t n_tokens;
    char **symbols;         /* by id: the byte-level spelling (vocab key), owned */
    str_slot *sym_table;    /* symbol text -> id */
    size_t sym_cap;
    pair_slot *merges;      /* pair -> rank, result */
    size_t merge_cap;
    uint32_t byte_token[256];
    added_token *added;     /* longest first */
    size_t n_added;
    bool first_byte_added[256];
    pcre2_code *re;
    bool nfc;               /* the normalizer is NFC (Qwen's tokenizer.json says so) */
    size_t long_piece;      /* pieces of this many symbols or more merge by rank buckets */
    tok_kind kind;
    /* SentencePiece-style (tokenizer_sp.c): */
    norm_step norms[TOK_MAX_NORMS]; /* the normalizer */
    int n_norms;
    bool metaspace;         /* a Metaspace pre-tokenizer (else none: a text is one piece) */
    bool meta_split;        /* it splits before each marker */
    int meta_prepend;       /* its prepend_scheme: 0 never, 1 first, 2 always */
    char marker[8];         /* the space marker, "\u2581" */
    bool byte_fallback;     /* a character outside the vocabulary is its bytes' <0xXX> */
    bool has_byte[256];     /* byte_token[b] is a <0xXX> token */
    int64_t unk;            /* the unknown token, -1: none */
    bool fuse_unk;          /* consecutive unknown characters are one <unk> */
    int strip_start;        /* the decoder strips up to this many leading spaces of a text */
    bool metaspace_decoder; /* a Metaspace decoder: the first token's markers vanish */
    /* the post-processor's special ids around one sequence (add_special_tokens) */
    uint32_t prefix[TOK_MAX_FRAME], suffix[TOK_MAX_FRAME];
    int n_prefix, n_suffix;
};

typedef struct bpe_scratch bpe_scratch;

/* ---- lookups (tokenizer.c) ------------------------------------------------- */

int64_t tok_sym_find(const vlmd_tokenizer *tok, const char *key, size_t len);

/* ---- the SentencePiece-style kind (tokenizer_sp.c) ------------------------- */

/* Reads the normalizer, pre-tokenizer, decoder and model fields of a
 * SentencePiece-style tokenizer.json j; an unsupported piece is
 * VLMD_ERR_MODEL naming it and what is supported. */
vlmd_status sp_configure(vlmd_tokenizer *tok, json_t *j, const char *path, vlmd_error *err);
/* A vocab key's text: its markers as spaces, or a <0xXX> token's byte. */
bool sp_piece_bytes(const vlmd_tokenizer *tok, const char *key, uint8_t *out, uint32_t *len,
                    bool *raw_byte);
/* Encodes one text between added tokens (first: it starts the whole input). */
vlmd_status sp_encode(const vlmd_tokenizer *tok, bpe_scratch *s, const char *text, size_t len,
                      bool first, vlmd_tokens *out);
void sp_free(vlmd_tokenizer *tok);

static inline uint64_t tok_hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* The merge of pair (a, b), or NULL. */
static inline const pair_slot *tok_merge_find(const vlmd_tokenizer *tok, uint32_t a, uint32_t b)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (size_t i = tok_hash_u64(key) & (tok->merge_cap - 1);; i = (i + 1) & (tok->merge_cap - 1)) {
        const pair_slot *s = &tok->merges[i];
        if (!s->key)
            return NULL;
        if (s->key == key)
            return s;
    }
}

/* ---- BPE merges (bpe.c) ---------------------------------------------------- */

/* One pending rank of a long piece (bpe.c's rank buckets): the positions of its pair. */
typedef struct rank_bucket {
    uint32_t rank, left, right, result;
    uint32_t *pos;          /* left symbols' indices; pos[done..n) still to take */
    size_t n, cap, done;
    bool sorted;            /* pos[done..n) ascending */
    bool queued;            /* in the rank heap */
} rank_bucket;

struct heap_item;

/* A caller's scratch for bpe_merge, zeroed before first use (bpe_scratch_free). */
struct bpe_scratch {
    uint32_t *id;           /* by position: the symbol there (its first symbol's index) */
    int32_t *prev, *next;   /* the symbols' list; prev -2: merged into its left neighbour */
    size_t cap;
    struct heap_item *heap; /* the heap of every pair */
    size_t heap_cap;
    rank_bucket *buckets;   /* the rank buckets: one per rank met in the piece */
    size_t n_buckets, bucket_cap;
    uint32_t *bucket_of;    /* rank -> bucket index + 1, open addressing */
    uint32_t last_bucket;   /* the one found last, index + 1 (0: none) */
    size_t slot_cap;
    uint32_t *ranks;        /* min-heap of queued buckets by rank */
    size_t n_ranks, ranks_cap;
};

/* Room for n initial symbols in s->id; false when out of memory. */
bool bpe_reserve(bpe_scratch *s, size_t n);
/* BPE over the n initial symbols the caller put in s->id: the lowest-ranked
 * pair first, the leftmost among equals, as Hugging Face's BPE merges;
 * appends the result to out. */
vlmd_status bpe_merge(const vlmd_tokenizer *tok, bpe_scratch *s, size_t n, vlmd_tokens *out);
void bpe_scratch_free(bpe_scratch *s);

#endif
