/* structured.h - constrained decoding: JSON Schema (and choice, regex, any
 * JSON object) compiled to a grammar, the grammar run as a pushdown automaton
 * over bytes, and per step the bitset of the vocabulary's tokens that keep
 * the output inside it.
 *
 * Defines: vlmd_grammar (a compiled grammar, immutable), vlmd_grammar_state
 * (one output's position in it: a plain value, copy it to snapshot),
 * vlmd_vocab (token id -> bytes and a token trie, immutable), vlmd_masker
 * (a grammar's token masks over one vocabulary, cached; thread-safe) and
 * vlmd_mask_scratch (working memory of one thread's mask computations).
 *
 * How the engine uses it (one request):
 *   compile   vlmd_grammar_compile_schema(schema text) -> grammar (a 400 with
 *             err.msg when it fails: the message starts with the JSON pointer
 *             of the offending schema, e.g. "#/properties/a: 'not' is not
 *             supported"); a grammar and its masker may be shared by every
 *             request with the same schema.
 *   start     vlmd_masker_create(grammar, vocab) once per grammar;
 *             vlmd_grammar_state_init(grammar, &st) per request.
 *   each step vlmd_masker_fill(masker, &st, eos ids, mask, n_words, scratch):
 *             the mask (uint32 words, bit i of word i/32 = token i allowed)
 *             is applied to the logits before sampling (disallowed tokens get
 *             -inf, on the CPU or copied to the device); the end-of-sequence
 *             ids the caller passes are allowed exactly when the grammar is
 *             complete. The mask is never empty.
 *             vlmd_masker_accept(masker, &st, sampled id) advances the state.
 *   preempt   keep st (a copy is a snapshot), or replay the output's tokens
 *             through vlmd_masker_accept from vlmd_grammar_state_init.
 *
 * A step costs the union of cached per-automaton-state masks (a few
 * microseconds at 150k tokens) plus the tokens whose acceptance depends on
 * the stack (they end a recursive value): resolved once per (state,
 * caller) and cached too, except those that end two values, which are run
 * against the stack. A state's mask is computed once, on first use, by a
 * walk of the token trie (docs/PERFORMANCE.md has the costs).
 *
 * Grammar rules (docs/API.md lists every keyword):
 * - properties come in the schema's order; required ones are always there,
 *   optional ones may each be left out; additional properties (when allowed)
 *   come after the declared ones, named by strings without escapes that are
 *   not a declared name. additionalProperties absent means false when the
 *   object declares properties, any value otherwise.
 * - whitespace: none, except one optional space after ',' and ':'
 *   (vlmd_grammar_options.compact: none at all). Nothing after the root value.
 * - strings are UTF-8 with JSON's escapes; pattern and format strings write
 *   each character in one way (escaped only where JSON requires).
 * - numbers with a bound have no exponent; oneOf is taken as anyOf.
 *
 * Limits (every schema is attacker-controlled): see the VLMD_GRAMMAR_MAX_*
 * below; past one, compiling fails with VLMD_ERR_TOO_LARGE naming it. */
#ifndef VLMD_STRUCTURED_H
#define VLMD_STRUCTURED_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

/* Limits of the compiler. */
#define VLMD_GRAMMAR_MAX_SCHEMA_BYTES (1u << 20)   /* schema text */
#define VLMD_GRAMMAR_MAX_SCHEMA_DEPTH 64           /* nested subschemas, inlined $refs included */
#define VLMD_GRAMMAR_MAX_PATTERN_BYTES 4096        /* one pattern or regex */
#define VLMD_GRAMMAR_MAX_REPEAT 4096               /* {m,n}, lengths, item counts */
#define VLMD_GRAMMAR_MAX_NUMBER_DIGITS 40          /* digits of a numeric bound */
#define VLMD_GRAMMAR_MAX_NFA_STATES (1u << 18)     /* before determinization */
#define VLMD_GRAMMAR_MAX_DFA_STATES (1u << 16)     /* the compiled automaton */
#define VLMD_GRAMMAR_MAX_WORK (1ull << 28)         /* compile steps, bounds the time (~1 s) */
/* Limits of the automaton at run time. */
#define VLMD_GRAMMAR_MAX_DEPTH 32       /* nesting of recursive values ($ref cycles, any JSON) */
#define VLMD_GRAMMAR_STATE_WORDS 512    /* one state: its stacks, in uint32 words */
/* Text tokens longer than this are left out of a vocabulary (never allowed). */
#define VLMD_VOCAB_MAX_TOKEN_BYTES 1024
/* Bytes of cached masks one masker keeps; past it masks are computed each step. */
#define VLMD_MASKER_MAX_CACHE_BYTES ((size_t)256 << 20)

typedef struct vlmd_grammar vlmd_grammar;

typedef struct vlmd_grammar_options {
    bool compact;   /* no whitespace at all (default: one optional space after ',' and ':') */
} vlmd_grammar_options;

/* Compiles a JSON Schema (text of at most VLMD_GRAMMAR_MAX_SCHEMA_BYTES, or a
 * parsed one, borrowed: its parts' reference counts change while it runs, so
 * no other thread may use that json_t meanwhile) to a grammar of the JSON
 * values it accepts. opt may be NULL. On failure *out is NULL and err names the place (a JSON pointer)
 * and the keyword: VLMD_ERR_INVALID_ARG for a schema that is malformed or
 * uses what is not supported, VLMD_ERR_TOO_LARGE past a limit. */
vlmd_status vlmd_grammar_compile_schema(const char *text, size_t len,
                                        const vlmd_grammar_options *opt, vlmd_grammar **out,
                                        vlmd_error *err);
vlmd_status vlmd_grammar_compile_schema_json(const json_t *schema, const vlmd_grammar_options *opt,
                                             vlmd_grammar **out, vlmd_error *err);
/* Any JSON object (response_format json_object). */
vlmd_status vlmd_grammar_compile_json_object(const vlmd_grammar_options *opt, vlmd_grammar **out,
                                             vlmd_error *err);
/* The output is exactly one of the n strings (vLLM's structured_outputs.choice);
 * n >= 1, each valid UTF-8. */
vlmd_status vlmd_grammar_compile_choice(const char *const *choices, const size_t *lens, size_t n,
                                        vlmd_grammar **out, vlmd_error *err);
/* The whole output matches the regular expression (vLLM's structured_outputs.regex;
 * the syntax of docs/API.md: classes, escapes, quantifiers, groups, alternation). */
vlmd_status vlmd_grammar_compile_regex(const char *pattern, size_t len, vlmd_grammar **out,
                                       vlmd_error *err);

/* Tool calls in one of three formats (frontend/tools.h names them):
 *   HERMES  Qwen's template: each call is
 *               {"name": "NAME", "arguments": ARGS}\n</tool_call>
 *           with ARGS a JSON value of that function's parameters schema (any
 *           JSON object when it has none); parallel calls follow as
 *           "\n<tool_call>\n{..." again;
 *   GLM45   GLM-4.5's template: each call is
 *               NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n ... </tool_call>
 *           one pair per property of the parameters' object schema, in its
 *           order (each required one, each optional one or not, then
 *           additional ones where allowed, any key that is no declared
 *           name), V the value's text where the property's schema says
 *           "type": "string" (its enum, const, pattern, format and lengths
 *           hold over that text), else the value's JSON; no V holds
 *           "</arg_value>" (where it has no recursion: a recursive value's
 *           strings are not checked for it); parallel calls follow as
 *           "\n<tool_call>NAME..."; a function without parameters takes any
 *           pairs. Only an object schema's keywords are read at the top of a
 *           function's parameters (type, properties, required,
 *           additionalProperties, and annotations); others are refused there;
 *   QWEN3_CODER  Qwen3.5's template: each call is
 *               NAME>\n<parameter=K>\nV\n</parameter>\n ... </function>\n</tool_call>
 *           the pairs as GLM45's, V as vLLM's qwen3_coder parser reads it
 *           back (by the property's "type" alone): "type": "string" the
 *           value's text (its enum, const, pattern, format and lengths held
 *           over it; never "null" in any case, which reads as null), a
 *           schema that holds nothing any text, another single type the
 *           value's JSON, a list of types of string, integer, number and
 *           null the JSON (read as a Python literal: booleans, objects and
 *           arrays are refused there), no type but an enum or const of
 *           strings the text (other untyped schemas are refused: vLLM reads
 *           them as text); additional properties' values are text (an
 *           additionalProperties schema other than a string's is refused);
 *           no V holds </parameter>, <parameter=, </function> or
 *           </tool_call>; parallel calls follow as "\n<tool_call>\n<function=NAME>...".
 * Then the output ends. It starts where the prompt or the model left it
 * (start):
 *   AT_NAME       after the call's open marker (hermes: `<tool_call>\n{"name": "`;
 *                 glm45: `<tool_call>`; qwen3_coder: `<tool_call>\n<function=`):
 *                 the prompt forced a call;
 *   AT_ARGUMENTS  after the named function's head (hermes: `<tool_call>\n{"name":
 *                 "NAME", "arguments": `; glm45: `<tool_call>NAME\n`;
 *                 qwen3_coder: `<tool_call>\n<function=NAME>\n`), NAME
 *                 fns[0]'s (a named function forced; later parallel calls
 *                 may be any function);
 *   AFTER_OPEN    after the `<tool_call>` the model wrote itself (hermes:
 *                 "\n{..."; glm45: as AT_NAME; qwen3_coder: "\n<function=...")
 * The strings match frontend/tools.c's prompt and the templates' calls
 * byte for byte. 1 to VLMD_GRAMMAR_MAX_FUNCTIONS functions, names of 1 to
 * VLMD_GRAMMAR_MAX_FUNCTION_NAME bytes (JSON-escaped where needed). A
 * failure in a function's schema names it: "functions[2].parameters: #/...". */
#define VLMD_GRAMMAR_MAX_FUNCTIONS 128
#define VLMD_GRAMMAR_MAX_FUNCTION_NAME 256
typedef enum vlmd_tool_call_format {
    VLMD_TOOL_CALLS_HERMES,
    VLMD_TOOL_CALLS_GLM45,
    VLMD_TOOL_CALLS_QWEN3_CODER,
} vlmd_tool_call_format;
typedef enum vlmd_tool_call_start {
    VLMD_TOOL_CALL_AT_NAME,
    VLMD_TOOL_CALL_AT_ARGUMENTS,
    VLMD_TOOL_CALL_AFTER_OPEN,
} vlmd_tool_call_start;
typedef struct vlmd_tool_function {
    const char *name;               /* name_len bytes (borrowed) */
    size_t name_len;
    const json_t *parameters;       /* a JSON Schema, borrowed as for _schema_json; NULL: any object */
} vlmd_tool_function;
vlmd_status vlmd_grammar_compile_tool_calls(vlmd_tool_call_format format,
                                            const vlmd_tool_function *fns, size_t n,
                                            vlmd_tool_call_start start, bool parallel,
                                            const vlmd_grammar_options *opt, vlmd_grammar **out,
                                            vlmd_error *err);
/* The same from its spec as REQUEST_SUBMIT carries it (at most
 * VLMD_GRAMMAR_MAX_SCHEMA_BYTES of JSON):
 *   {"format": "hermes" | "glm45" | "qwen3_coder" (absent: hermes),
 *    "start": "name" | "arguments" | "open", "parallel": true | false,
 *    "functions": [{"name": "...", "parameters": SCHEMA or null}, ...]} */
vlmd_status vlmd_grammar_compile_tool_calls_spec(const char *text, size_t len,
                                                 const vlmd_grammar_options *opt,
                                                 vlmd_grammar **out, vlmd_error *err);
/* The added tokens a tool-call grammar writes ("<tool_call>", "<arg_key>",
 * ...; NULL-ended): a vocabulary made from a tokenizer (vlmd_vocab_from_
 * tokenizer) keeps them even where the tokenizer calls them special, as
 * GLM's does, so that a mask can allow them; other special tokens are never
 * text. */
extern const char *const vlmd_grammar_marker_tokens[];
/* One entry point for a grammar as a request carries it (proto.h's
 * vlmd_grammar_kind by its name, vlmd_grammar_kind_str): "json_schema" (the
 * schema's text), "json_object" (text ignored), "regex" (the pattern),
 * "choice" (a JSON list of strings), "tool_calls" (the spec above); at most
 * VLMD_GRAMMAR_MAX_SCHEMA_BYTES of text. Fails as the form's compiler does;
 * an unknown form is VLMD_ERR_INVALID_ARG. */
vlmd_status vlmd_grammar_compile_text(const char *form, const char *text, size_t len,
                                      vlmd_grammar **out, vlmd_error *err);
void vlmd_grammar_free(vlmd_grammar *g);    /* accepts NULL */

/* Automaton states after compilation (for logs and benchmarks). */
uint32_t vlmd_grammar_n_states(const vlmd_grammar *g);

/* Where one output is in a grammar: the set of its possible stacks. A plain
 * value of fixed size: assign or memcpy it to keep a snapshot. */
typedef struct vlmd_grammar_state {
    uint32_t w[VLMD_GRAMMAR_STATE_WORDS];
} vlmd_grammar_state;

/* The state before any output. */
void vlmd_grammar_state_init(const vlmd_grammar *g, vlmd_grammar_state *st);
/* Advances st over bytes[0..n): true when they keep the output inside the
 * grammar; false leaves st unchanged (the bytes are refused, or the state
 * would need more than VLMD_GRAMMAR_STATE_WORDS: an ambiguous grammar). */
bool vlmd_grammar_accept_bytes(const vlmd_grammar *g, vlmd_grammar_state *st, const uint8_t *bytes,
                               size_t n);
/* True when the output so far is a whole value of the grammar (the end may
 * come here; more bytes may still be allowed, e.g. after "12"). */
bool vlmd_grammar_is_complete(const vlmd_grammar *g, const vlmd_grammar_state *st);
/* The fewest bytes that complete the output from st (0 when complete): lets
 * a caller that is running out of tokens steer to an end. */
size_t vlmd_grammar_min_completion(const vlmd_grammar *g, const vlmd_grammar_state *st);
/* True when st can still reach completion (every state that accept_bytes and
 * init produce can: always true for those; false for a zeroed one). */
bool vlmd_grammar_state_alive(const vlmd_grammar_state *st);

/* A vocabulary: token id -> bytes, and the trie the masks walk. */
typedef struct vlmd_vocab vlmd_vocab;

/* Builds a vocabulary of n tokens: bytes[i][0..lens[i]) is token i's text;
 * bytes[i] NULL or lens[i] 0 marks a token that is not text (a special
 * token), which no mask ever allows (an EOS id is allowed by
 * vlmd_masker_fill's eos argument only). Copies what it needs. */
vlmd_status vlmd_vocab_create(uint32_t n, const uint8_t *const *bytes, const size_t *lens,
                              vlmd_vocab **out, vlmd_error *err);
/* The tokenizer's vocabulary: special tokens ("special": true) are not text,
 * but for vlmd_grammar_marker_tokens; other added tokens are their text. */
vlmd_status vlmd_vocab_from_tokenizer(const vlmd_tokenizer *tok, vlmd_vocab **out,
                                      vlmd_error *err);
void vlmd_vocab_free(vlmd_vocab *v);    /* accepts NULL */
uint32_t vlmd_vocab_size(const vlmd_vocab *v);
/* Token id's text; false for a special token or an id outside the vocabulary. */
bool vlmd_vocab_token(const vlmd_vocab *v, uint32_t id, const uint8_t **bytes, size_t *len);

/* A grammar's masks over a vocabulary; borrows both (they must outlive it).
 * Masks are computed per automaton state on first use and kept (up to
 * VLMD_MASKER_MAX_CACHE_BYTES, and within a shared vlmd_mask_budget); fill
 * and accept may be called from several threads at once, each with its own
 * scratch. */
typedef struct vlmd_masker vlmd_masker;
typedef struct vlmd_mask_scratch vlmd_mask_scratch;

vlmd_status vlmd_masker_create(const vlmd_grammar *g, const vlmd_vocab *v, vlmd_masker **out,
                               vlmd_error *err);
/* A bound on the cached masks of several maskers together: a masker made
 * with one keeps a new mask only while their sum stays within `limit` (past
 * it the mask is computed at each step instead), and gives its bytes back
 * when freed. `used` is updated atomically (fills may run on several
 * threads); set it to 0 and `limit` before the first masker. */
typedef struct vlmd_mask_budget {
    size_t limit;
    size_t used;
} vlmd_mask_budget;
/* As vlmd_masker_create, its cached masks also within budget (borrowed: it
 * must outlive the masker; NULL: no shared bound). */
vlmd_status vlmd_masker_create_bounded(const vlmd_grammar *g, const vlmd_vocab *v,
                                       vlmd_mask_budget *budget, vlmd_masker **out,
                                       vlmd_error *err);
void vlmd_masker_free(vlmd_masker *m);  /* accepts NULL */
/* A thread's working memory for fills: up to (longest token + 1) * 2 KiB,
 * grown on first use. A fill without one allocates and frees its own. */
vlmd_mask_scratch *vlmd_mask_scratch_create(void);     /* NULL when out of memory */
void vlmd_mask_scratch_free(vlmd_mask_scratch *s);     /* accepts NULL */

/* Fills mask[0..n_words) (n_words * 32 >= the vocabulary's size; bits past
 * it are 0): bit i is set when token i's bytes keep st inside the grammar,
 * and for each of eos[0..n_eos) when st is complete. Fails only on
 * allocation failure (VLMD_ERR_NOMEM) or a mask too short
 * (VLMD_ERR_INVALID_ARG). */
vlmd_status vlmd_masker_fill(vlmd_masker *m, const vlmd_grammar_state *st, const uint32_t *eos,
                             size_t n_eos, uint32_t *mask, size_t n_words, vlmd_mask_scratch *s,
                             vlmd_error *err);
/* Advances st over token id's bytes: true when the mask allowed it (a text
 * token the grammar accepts); false leaves st unchanged. End-of-sequence ids
 * are the caller's: check vlmd_grammar_is_complete. */
bool vlmd_masker_accept(const vlmd_masker *m, vlmd_grammar_state *st, uint32_t id);

/* Cache statistics (benchmarks, tests). */
typedef struct vlmd_masker_stats {
    uint64_t fills;             /* vlmd_masker_fill calls */
    uint64_t states_computed;   /* per-state masks made by a trie walk */
    uint64_t contexts_computed; /* a state's stack-dependent tokens resolved for one caller */
    uint64_t stack_checks;      /* tokens run against a whole stack (they end two rules) */
    uint64_t deep_checks;       /* tokens run against a stack near the depth limit */
    size_t cache_bytes;
} vlmd_masker_stats;
void vlmd_masker_get_stats(vlmd_masker *m, vlmd_masker_stats *out);

#endif
