/* prefix_book.h - what the router believes an engine's prefix cache holds:
 * the blocks of the prompts it sent there, for routing a request to the
 * engine holding its longest prefix (docs/ARCHITECTURE.md, Engines).
 *
 * A prompt is cut into blocks of PREFIX_BOOK_BLOCK tokens (a partial last
 * block is left out, as the engine's cache and the KV events leave it), and
 * each block is named by a hash chained over every block before it, so a
 * block's hash stands for the whole prefix up to its end. An image's hash is
 * mixed into each block its tokens touch (its placeholder tokens are alike
 * in every image). The book keeps about `limit` blocks, the engine's KV
 * capacity: it holds two generations of hashes, the newest first; a block
 * booked again is refreshed, and when the newest fills up the oldest is dropped,
 * so the book forgets in least-recently-used order, generation by
 * generation, in constant time. An engine restarted holds nothing: clear. */
#ifndef VLMD_PREFIX_BOOK_H
#define VLMD_PREFIX_BOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "status.h"

#define PREFIX_BOOK_BLOCK 16

typedef struct prefix_gen {
    uint64_t *keys;             /* open addressing; 0 = empty */
    size_t n, cap;              /* cap: a power of two, at least twice what it may hold */
} prefix_gen;

typedef struct prefix_book {
    prefix_gen gens[2];         /* [0] the newest */
    size_t limit;               /* blocks per generation */
} prefix_book;

/* The chained block hashes of a prompt (tokens, and its images): a heap
 * array of n_tokens / PREFIX_BOOK_BLOCK hashes into *out (NULL when none). */
vlmd_status prefix_book_hash_prompt(const uint32_t *tokens, uint32_t n_tokens,
                                    const vlmd_image_ref *images, uint32_t n_images,
                                    uint64_t **out, uint32_t *n_out);

/* Sizes an empty book for about limit_blocks blocks (at least 64). */
vlmd_status prefix_book_init(prefix_book *b, size_t limit_blocks);
void prefix_book_free(prefix_book *b);
/* Forgets every block (the engine's cache was lost). */
void prefix_book_clear(prefix_book *b);
/* Books a prompt's blocks as held (those known already are fresh again). */
void prefix_book_add(prefix_book *b, const uint64_t *blocks, uint32_t n);
/* How many of the prompt's leading blocks the book holds. */
uint32_t prefix_book_match(const prefix_book *b, const uint64_t *blocks, uint32_t n);

#endif
