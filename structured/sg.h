/* sg.h - internals of structured/ shared by its files (not for callers).
 *
 * Defines the NFA builder (sg_build: states, edges, fragments, the sticky
 * error that carries the schema's JSON pointer), codepoint sets, DFAs
 * (sg_dfa: byte classes, transition table, rule calls) and the compiled
 * grammar (struct vlmd_grammar), plus the state stepping that grammar.c
 * implements for the matcher and the masks.
 *
 * Automaton model: a grammar is a set of rules; each rule is a DFA over
 * bytes whose states may also have call edges (rule R, return state). A
 * configuration is a stack of DFA states (bottom..top); a state of an output
 * is a set of configurations. Calls appear only where values recurse ($ref
 * cycles, any JSON value); everything else is inlined. */
#ifndef VLMD_SG_H
#define VLMD_SG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "structured.h"

#define SG_NONE UINT32_MAX

/* ---- NFA builder ---------------------------------------------------------- */

enum { SG_EDGE_BYTES, SG_EDGE_EPS, SG_EDGE_CALL };

typedef struct sg_edge {
    uint32_t to;
    uint32_t next;      /* the state's next edge, SG_NONE at the end */
    uint32_t rule;      /* SG_EDGE_CALL: the rule called (to = where it returns) */
    uint8_t kind, lo, hi;
} sg_edge;

/* A piece of NFA: enter at start, leave from accept (which has no edges of
 * its own while the fragment is built). Its states are [lo, hi) and its
 * edges stay inside that range, so a fragment can be copied. */
typedef struct sg_frag {
    uint32_t start, accept, lo, hi;
} sg_frag;

typedef struct sg_build {
    uint32_t *first;            /* [cap_states] first edge of each state */
    uint32_t n_states, cap_states;
    sg_edge *edges;
    uint32_t n_edges, cap_edges;
    uint64_t work;              /* compile steps so far (VLMD_GRAMMAR_MAX_WORK) */
    bool failed;
    vlmd_error *err;            /* the first failure, prefixed with path */
    char path[512];             /* JSON pointer of the schema being compiled ("#/...") */
    size_t path_len;
    bool compact;               /* no optional spaces */
} sg_build;

/* Records the first failure (later ones are dropped): "PATH: message". */
void sg_fail(sg_build *b, vlmd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Adds steps to the work count; fails past VLMD_GRAMMAR_MAX_WORK. */
bool sg_work(sg_build *b, uint64_t steps);

uint32_t sg_state(sg_build *b);
void sg_add_edge(sg_build *b, uint32_t from, uint32_t to, int kind, uint8_t lo, uint8_t hi,
                 uint32_t rule);
void sg_build_free(sg_build *b);

sg_frag sg_nothing(sg_build *b);                  /* accepts no string */
sg_frag sg_empty(sg_build *b);                    /* accepts only "" */
sg_frag sg_range(sg_build *b, uint8_t lo, uint8_t hi);
sg_frag sg_literal(sg_build *b, const void *bytes, size_t n);
sg_frag sg_call(sg_build *b, uint32_t rule);
sg_frag sg_cat(sg_build *b, sg_frag x, sg_frag y);
sg_frag sg_alt(sg_build *b, sg_frag x, sg_frag y);
sg_frag sg_opt(sg_build *b, sg_frag x);
sg_frag sg_star(sg_build *b, sg_frag x);
sg_frag sg_copy(sg_build *b, sg_frag x);          /* x must not be linked to anything yet */
/* x{min,max} (max SG_NONE: unbounded); x must not be linked yet. */
sg_frag sg_repeat(sg_build *b, sg_frag x, uint32_t min, uint32_t max);
/* One optional space (nothing in compact mode). */
sg_frag sg_ws(sg_build *b);

/* ---- codepoint sets ------------------------------------------------------- */

typedef struct sg_cp_range {
    uint32_t lo, hi;
} sg_cp_range;

/* Sorted, disjoint, non-adjacent ranges of Unicode scalar values. */
typedef struct sg_cpset {
    sg_cp_range *r;
    size_t n, cap;
} sg_cpset;

bool sg_cpset_add(sg_cpset *s, uint32_t lo, uint32_t hi);   /* false: out of memory */
bool sg_cpset_add_set(sg_cpset *s, const sg_cpset *o);
bool sg_cpset_negate(sg_cpset *s);      /* complement within the scalar values */
void sg_cpset_free(sg_cpset *s);

/* How characters are written: as they are (a regex over the whole output),
 * or inside a JSON string (quote, backslash and controls escaped). A regex
 * also takes SG_TEXT_RAW_SEARCH: characters as they are, matched as a JSON
 * Schema pattern (a glm45 or qwen3_coder call's string value is its text). */
enum { SG_TEXT_RAW, SG_TEXT_JSON, SG_TEXT_RAW_SEARCH };

/* One character of the set, each written in one way (SG_TEXT_JSON: the
 * characters JSON must escape as their short escape or \u00XX in either
 * case, '/' also as "\/"). */
sg_frag sg_chars(sg_build *b, const sg_cpset *s, int text);
/* Any character of a JSON string in any of JSON's spellings (\uXXXX escapes,
 * surrogate pairs included). */
sg_frag sg_json_char(sg_build *b);
/* A JSON string's text for s (canonical escapes), without the quotes. */
bool sg_json_escape(const char *s, size_t n, char **out, size_t *out_len);

/* ---- DFAs ---------------------------------------------------------------- */

typedef struct sg_call_edge {
    uint32_t from, rule, ret;
} sg_call_edge;

typedef struct sg_dfa {
    uint32_t n, cap;
    uint32_t ncls;
    uint8_t cls[256];           /* byte -> class */
    uint32_t *next;             /* [n * ncls] target or SG_NONE */
    uint8_t *final;             /* [n] */
    uint32_t *rule;             /* [n] the rule a state belongs to */
    sg_call_edge *calls;        /* sorted by from */
    uint32_t n_calls, cap_calls;
} sg_dfa;

/* Byte classes of the edges of states [lo, hi): bytes no edge tells apart
 * share a class. */
void sg_dfa_set_classes(sg_dfa *d, const sg_build *b, uint32_t lo, uint32_t hi);
/* Subset construction of the NFA from start (accepting at accept) into d,
 * its states tagged with rule; returns the start state (SG_NONE on failure:
 * b->failed). Call edges become DFA call edges. */
uint32_t sg_determinize(sg_build *b, sg_dfa *d, uint32_t rule, uint32_t start, uint32_t accept);
void sg_dfa_free(sg_dfa *d);

/* The strings both fragments accept (both without calls). */
sg_frag sg_intersect(sg_build *b, sg_frag x, sg_frag y);
/* The strings x accepts and y does not. */
sg_frag sg_minus(sg_build *b, sg_frag x, sg_frag y);

/* ---- regular expressions ---------------------------------------------------- */

/* The language of pattern. SG_TEXT_JSON: a JSON Schema pattern, matched
 * anywhere in the string unless anchored by ^ and $ (ECMA-262 search);
 * SG_TEXT_RAW_SEARCH: the same over text written as it is; SG_TEXT_RAW: the
 * whole text matches. Errors name the offset. */
sg_frag sg_regex(sg_build *b, const char *pattern, size_t len, int text);

/* ---- the grammar ---------------------------------------------------------- */

struct vlmd_grammar {
    sg_dfa dfa;                 /* every rule's states */
    uint32_t n_rules;
    uint32_t *rule_start;       /* [n_rules] */
    uint32_t root;              /* rule of the output */
    uint32_t *call_off;         /* [n+1] calls of state s: dfa.calls[call_off[s]..call_off[s+1]) */
    uint8_t *has_bytes;         /* [n] some byte leads somewhere */
    uint32_t *need;             /* [n] stack depth to reach the rule's end (0: none) */
    uint32_t *minb;             /* [n] fewest bytes to the rule's end */
    uint32_t *rule_minb;        /* [n_rules] fewest bytes of a rule's value */
    bool root_called;           /* some rule calls the root (else its end ends the output) */
};

/* Finishes a grammar: determinizes each rule (fragment rule_frag[r]), trims
 * what cannot complete (within VLMD_GRAMMAR_MAX_DEPTH) or is unreachable,
 * refuses recursion that consumes nothing. Takes nothing over; fills g. */
vlmd_status sg_grammar_finish(sg_build *b, const sg_frag *rule_frag, uint32_t n_rules,
                              vlmd_grammar **out, vlmd_error *err);
/* The compile entry points share this: the builder set up, then done. */
void sg_build_init(sg_build *b, vlmd_error *err, bool compact);

/* State layout (vlmd_grammar_state.w and the walks of mask.c):
 *   w[0] words used (header included), w[1] flags, then configurations,
 *   each [depth, frame 0 (bottom), ..., frame depth-1 (top)]. */
#define SG_HDR 2
enum {
    SG_BOTTOM_FINAL = 1,        /* a bottom frame can end: the output is complete
                                 * (relative walks: the rule ends, the stack below decides) */
    SG_ESCAPED = 2,             /* relative walks: some path ended its bottom rule earlier */
    SG_OVERFLOW = 4,            /* the state did not fit its words */
};

/* One byte from in to out (cap words): each configuration's top moves on
 * the byte, then expands (calls pushed, ended rules popped) keeping
 * configurations whose top reads bytes. A configuration may not grow past
 * depth_limit frames counting what needs to follow (need); *max_need (when
 * not NULL) gets the largest depth + need seen. Flags: out's SG_ESCAPED is
 * in's SG_ESCAPED or SG_BOTTOM_FINAL. */
void sg_step(const vlmd_grammar *g, const uint32_t *in, uint8_t byte, uint32_t *out, uint32_t cap,
             uint32_t depth_limit, uint32_t *max_need);
/* A state of the single configuration frames[0..depth) expanded, with
 * flags to start from (max_need as for sg_step, may be NULL). */
void sg_state_from(const vlmd_grammar *g, const uint32_t *frames, uint32_t depth, uint32_t *out,
                   uint32_t cap, uint32_t flags, uint32_t *max_need);
/* A state with no calls that cannot end its rule: a single configuration
 * moves through it as a plain DFA (the masks' fast path). */
static inline bool sg_plain(const vlmd_grammar *g, uint32_t s)
{
    return g->call_off[s] == g->call_off[s + 1] && !g->dfa.final[s];
}
static inline bool sg_has_configs(const uint32_t *w)
{
    return w[0] > SG_HDR;
}

#endif
