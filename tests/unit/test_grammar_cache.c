/* test_grammar_cache.c - the engine's grammar cache stays within its bound:
 * the masks cached for grammars that requests hold (which eviction cannot
 * drop) count against it too, and the masks are the same whether a state's
 * mask was kept or computed again; unheld entries are evicted past it. */
#include <criterion/criterion.h>
#include <string.h>

#include "grammar_cache.h"
#include "proto.h"
#include "synth_vocab.h"

#define N_TOKENS 4096
#define WORDS (N_TOKENS / 32)

static bool allowed(const uint32_t *mask, uint32_t id)
{
    return mask[id / 32] >> (id % 32) & 1;
}

Test(grammar_cache, held_grammars_masks_stay_within_the_bound)
{
    synth_vocab sv;
    cr_assert(synth_vocab_make(N_TOKENS, 4, 7, &sv));
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_create(sv.n, (const uint8_t *const *)sv.bytes, sv.lens, &v, NULL),
                 VLMD_OK);
    const size_t bound = 64 << 10;
    grammar_cache *c = NULL;
    cr_assert_eq(grammar_cache_create(v, 8, bound, &c, NULL), VLMD_OK);
    /* three grammars of 200 states each, all held, every state's mask asked for: their
     * masks (360 KB of them here) cannot all be kept */
    const char *texts[3] = {"[a-m]{200}", "[n-z]{200}", "[a-z]{200}"};
    grammar_entry *held[3];
    uint32_t eos = N_TOKENS - 1, mask[WORDS];
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(grammar_cache_acquire(c, VLMD_GRAMMAR_REGEX, texts[k], strlen(texts[k]),
                                           &held[k], NULL), VLMD_OK);
        vlmd_masker *m = grammar_entry_masker(held[k]);
        vlmd_grammar_state st;
        vlmd_grammar_state_init(grammar_entry_grammar(held[k]), &st);
        for (int step = 0; step < 200; step++) {
            cr_assert_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, WORDS, NULL, NULL), VLMD_OK);
            uint32_t want = (uint32_t)texts[k][1];
            cr_assert(allowed(mask, want), "grammar %d step %d: its character", k, step);
            cr_assert_not(allowed(mask, '0'), "grammar %d step %d: another", k, step);
            cr_assert_not(allowed(mask, eos), "grammar %d step %d: not complete yet", k, step);
            cr_assert(vlmd_masker_accept(m, &st, want));
        }
    }
    size_t masks = 0;
    for (int k = 0; k < 3; k++) {
        vlmd_masker_stats ms;
        vlmd_masker_get_stats(grammar_entry_masker(held[k]), &ms);
        masks += ms.cache_bytes;
    }
    cr_expect_leq(masks, bound, "%zu bytes of masks kept for a bound of %zu", masks, bound);
    cr_expect_gt(masks, bound / 2, "the bound is used: %zu bytes", masks);
    /* released, they are evicted until the cache is within its bound again */
    for (int k = 0; k < 3; k++)
        grammar_cache_release(c, held[k]);
    grammar_cache_stats s;
    grammar_cache_get_stats(c, &s);
    cr_expect_leq(s.bytes, bound, "%zu bytes cached", s.bytes);
    cr_expect_geq(s.evictions, 1);
    grammar_cache_free(c);
    vlmd_vocab_free(v);
    synth_vocab_free(&sv);
}
