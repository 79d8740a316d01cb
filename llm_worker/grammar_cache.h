/* grammar_cache.h - the engine's compiled grammars and their token maskers,
 * shared by every request that asks for the same (kind, text).
 *
 * A grammar's first use compiles it (structured.h, vlmd_grammar_compile_text)
 * and makes its masker, whose per-state masks then serve every request with
 * that grammar (a state's first mask costs a trie walk; later ones are
 * cached). Bounded: at most max_entries grammars and max_bytes of texts,
 * automata and cached masks together; past either, the least recently used
 * entries no request holds are dropped. Held ones stay, so their texts and
 * automata can pass the bound while they run; their masks cannot: every
 * masker's cached masks come from one budget of max_bytes (past it a state's
 * mask is computed at each step instead of kept). One thread uses it: the
 * engine's owner. */
#ifndef VLMD_GRAMMAR_CACHE_H
#define VLMD_GRAMMAR_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "structured.h"

typedef struct grammar_cache grammar_cache;
typedef struct grammar_entry grammar_entry;

/* Borrows the vocabulary (it must outlive the cache). */
vlmd_status grammar_cache_create(const vlmd_vocab *v, uint32_t max_entries, size_t max_bytes,
                                 grammar_cache **out, vlmd_error *err);
void grammar_cache_free(grammar_cache *c);  /* accepts NULL; no entry may be held */

/* The entry of (kind, text[0..len)), compiled now when it is not cached;
 * held until grammar_cache_release. A grammar that does not compile is
 * VLMD_ERR_INVALID_ARG or VLMD_ERR_TOO_LARGE with the compiler's message
 * (naming the place and the keyword), and is not cached. kind is a
 * vlmd_grammar_kind other than NONE. */
vlmd_status grammar_cache_acquire(grammar_cache *c, uint32_t kind, const char *text, size_t len,
                                  grammar_entry **out, vlmd_error *err);
void grammar_cache_release(grammar_cache *c, grammar_entry *e);   /* accepts NULL */

/* Whether (kind, text) is compiled here (no use counted). */
bool grammar_cache_has(const grammar_cache *c, uint32_t kind, const char *text, size_t len);

/* Takes g, compiled from (kind, text) elsewhere (grammar_jobs.h: on the thread
 * pool), as the unheld entry the next acquire finds; counted as a compile. */
vlmd_status grammar_cache_adopt(grammar_cache *c, uint32_t kind, const char *text, size_t len,
                                vlmd_grammar *g, vlmd_error *err);

const vlmd_grammar *grammar_entry_grammar(const grammar_entry *e);
vlmd_masker *grammar_entry_masker(const grammar_entry *e);

typedef struct grammar_cache_stats {
    uint32_t entries;
    size_t bytes;               /* texts, automata and cached masks (as last measured) */
    uint64_t hits, compiles, failures, evictions;
} grammar_cache_stats;
void grammar_cache_get_stats(const grammar_cache *c, grammar_cache_stats *out);

#endif
