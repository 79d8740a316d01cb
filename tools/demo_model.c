/* demo_model.c - the demo model generator (see demo_model.h).
 *
 *   1. tokenizer: the 256 byte-level symbols (GPT-2's bytes_to_unicode
 *      order, as Qwen's tokenizer.json has them), then BPE merges learned
 *      from demo_corpus.h (merge i makes token 256 + i), then Qwen's 26 added
 *      tokens (<tool_call>, <think> and the rest; Qwen3.5's chat template,
 *      demo_chat_template.h, uses them);
 *   2. config: Qwen2-VL in the nested text_config / rope_parameters shape;
 *   3. weights: every tensor a Qwen2-VL checkpoint has, N(0, 0.02) from a
 *      seeded splitmix64 through Box-Muller (norm weights 1, biases 0),
 *      rounded to BF16, in name order like the checkpoints torch writes.
 *
 * Ownership of DIR is the stamp file: written first as "incomplete", each
 * file then goes to DIR/.tmp-NAME and is renamed, and the stamp is rewritten
 * as complete last. A DIR with our stamp is ours to (re)write; one without it
 * that holds any of our file names is someone else's and is left alone. */
#include "demo_model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "buf.h"
#include "demo_chat_template.h"
#include "demo_corpus.h"
#include "log.h"

/* ---- dimensions ---------------------------------------------------------- */

enum {
    DEMO_MERGES = 768,              /* merges asked of the trainer (fewer if the text runs out) */
    DEMO_HIDDEN = 256,
    DEMO_INTERMEDIATE = 512,
    DEMO_LAYERS = 4,
    DEMO_HEADS = 8,
    DEMO_KV_HEADS = 2,
    DEMO_HEAD_DIM = DEMO_HIDDEN / DEMO_HEADS,
    DEMO_MAX_POSITIONS = 4096,
    DEMO_VISION_DEPTH = 2,
    DEMO_VISION_WIDTH = 128,
    DEMO_VISION_HEADS = 4,
    DEMO_VISION_MLP_RATIO = 2,
    DEMO_PATCH = 14,
    DEMO_TEMPORAL_PATCH = 2,
    DEMO_MERGE = 2,
    DEMO_MIN_PIXELS = 56 * 56,              /* 4 merged tokens */
    DEMO_MAX_PIXELS = 1280 * 28 * 28,       /* 1280 merged tokens */
};
static const int demo_mrope_section[3] = {4, 6, 6}; /* sums to DEMO_HEAD_DIM / 2 */
static const double demo_init_std = 0.02;

/* Qwen's added tokens, in the order (and so with the ids) its tokenizer.json
 * has them; the first N_CONTROL are special, the rest (tool-call, FIM,
 * tool-response and think markers) not: their text stays in an answer, where
 * the parsers read it, as there. */
static const char *const special_tokens[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
};
#define N_SPECIAL (int)(sizeof special_tokens / sizeof special_tokens[0])

#define N_CONTROL 14
enum { /* offsets of the specials config.json names */
    SPECIAL_ENDOFTEXT = 0, SPECIAL_IM_END = 2, SPECIAL_VISION_START = 9, SPECIAL_VISION_END = 10,
    SPECIAL_IMAGE_PAD = 12, SPECIAL_VIDEO_PAD = 13,
};

static const char *const output_names[] = {
    "config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
    "tokenizer.json", "tokenizer_config.json",
};
#define N_OUTPUTS (int)(sizeof output_names / sizeof output_names[0])
static const char stamp_name[] = ".vlmd-demo-model";
static const char stamp_prefix[] = "vlmd demo model ";

/* ---- byte-level BPE training --------------------------------------------- */

typedef struct vocab {
    char **tokens;      /* id -> UTF-8 of the byte-level symbols; owned */
    int n;
    int (*merges)[2];   /* rank -> the two ids merged; merge r made id 256 + r */
    int n_merges;
    int byte_id[256];   /* byte -> id of its symbol */
} vocab;

static bool byte_is_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
 * U+0100 onwards in byte order; ids follow that order (printable bytes first). */
static void byte_symbols(vocab *v)
{
    int order[256], n = 0;
    unsigned code[256];
    for (int b = 0; b < 256; b++)
        if (byte_is_printable(b)) {
            order[n] = b;
            code[n++] = (unsigned)b;
        }
    for (int b = 0, extra = 0; b < 256; b++)
        if (!byte_is_printable(b)) {
            order[n] = b;
            code[n++] = 256u + (unsigned)extra++;
        }
    for (int i = 0; i < 256; i++) {
        char utf8[3] = {0};
        if (code[i] < 0x80) {
            utf8[0] = (char)code[i];
        } else {
            utf8[0] = (char)(0xc0 | (code[i] >> 6));
            utf8[1] = (char)(0x80 | (code[i] & 0x3f));
        }
        v->tokens[i] = vlmd_xstrdup(utf8);
        v->byte_id[order[i]] = i;
    }
    v->n = 256;
}

static bool is_letter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
static bool is_wordy(unsigned char c) { return is_letter(c) || c >= 0x80; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Length of the next pre-token at s, approximating the Qwen2 Split regex:
 * words with one optional leading non-letter, single digits, punctuation runs
 * with an optional leading space, whitespace (a run before a word leaves its
 * last space to the word). Merges never cross these boundaries. */
static size_t next_piece(const unsigned char *s, size_t n)
{
    size_t i = 0;
    if (is_digit(s[0]))
        return 1;
    if (is_wordy(s[0]) || (n > 1 && !is_digit(s[0]) && s[0] != '\n' && s[0] != '\r' &&
                           is_wordy(s[1]))) {
        i = is_wordy(s[0]) ? 0 : 1;
        while (i < n && is_wordy(s[i]))
            i++;
        return i;
    }
    if (is_space(s[0])) {
        while (i < n && is_space(s[i]))
            i++;
        bool newline = memchr(s, '\n', i) != NULL;
        if (!newline && i > 1 && i < n)
            return i - 1;
        return i;
    }
    i = (s[0] == ' ') ? 1 : 0;
    while (i < n && !is_space(s[i]) && !is_wordy(s[i]) && !is_digit(s[i]))
        i++;
    while (i < n && (s[i] == '\n' || s[i] == '\r'))
        i++;
    return i ? i : 1;
}

typedef struct word {
    int *ids;       /* current tokens of this pre-token; owned */
    int len;
    int freq;       /* how often it occurs in the corpus */
} word;

/* Splits the corpus into distinct pre-tokens with their counts; *n_symbols
 * gets the total length, the most pairs a round can see. */
static word *corpus_words(const vocab *v, int *n_out, int *n_symbols)
{
    const unsigned char *s = (const unsigned char *)demo_corpus;
    size_t n = sizeof demo_corpus - 1, cap = 1024;
    word *w = calloc(cap, sizeof *w);
    int nw = 0;
    VLMD_ASSERT(w);
    *n_symbols = 0;
    for (size_t pos = 0; pos < n;) {
        size_t len = next_piece(s + pos, n - pos);
        int found = -1;
        for (int k = 0; k < nw && found < 0; k++) {
            if ((size_t)w[k].len != len)
                continue;
            bool same = true;
            for (size_t j = 0; j < len && same; j++)
                same = w[k].ids[j] == v->byte_id[s[pos + j]];
            if (same)
                found = k;
        }
        if (found >= 0) {
            w[found].freq++;
        } else {
            if ((size_t)nw == cap) {
                cap *= 2;
                w = realloc(w, cap * sizeof *w);
                VLMD_ASSERT(w);
            }
            w[nw].ids = malloc(len * sizeof(int));
            VLMD_ASSERT(w[nw].ids);
            for (size_t j = 0; j < len; j++)
                w[nw].ids[j] = v->byte_id[s[pos + j]];
            w[nw].len = (int)len;
            w[nw].freq = 1;
            *n_symbols += (int)len;
            nw++;
        }
        pos += len;
    }
    *n_out = nw;
    return w;
}

static int vocab_find(const vocab *v, const char *tok)
{
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->tokens[i], tok) == 0)
            return i;
    return -1;
}

/* Replaces every (a, b) in the words by id. */
static void apply_merge(word *w, int nw, int a, int b, int id)
{
    for (int k = 0; k < nw; k++) {
        int out = 0;
        for (int j = 0; j < w[k].len; j++) {
            if (j + 1 < w[k].len && w[k].ids[j] == a && w[k].ids[j + 1] == b) {
                w[k].ids[out++] = id;
                j++;
            } else {
                w[k].ids[out++] = w[k].ids[j];
            }
        }
        w[k].len = out;
    }
}

/* Learns up to DEMO_MERGES merges: each round merges the most frequent
 * adjacent pair (ties: the lowest ids) until every word is one token. A pair
 * whose concatenation is already a token (another split of the same string)
 * is never merged, so merge r always makes the new token 256 + r. Pairs are
 * counted in a dense table, and only the entries a round touched are read
 * and cleared, so a round costs the corpus length. */
static void learn_merges(vocab *v)
{
    int nw, n_symbols;
    word *w = corpus_words(v, &nw, &n_symbols);
    const size_t max_ids = 256 + DEMO_MERGES;
    int *counts = calloc(max_ids * max_ids, sizeof *counts);   /* a * max_ids + b -> count */
    bool *banned = calloc(max_ids * max_ids, sizeof *banned);  /* pairs never to merge */
    size_t *touched = malloc((size_t)n_symbols * sizeof *touched);
    VLMD_ASSERT(counts && banned && touched);
    while (v->n_merges < DEMO_MERGES) {
        size_t n_touched = 0;
        for (int k = 0; k < nw; k++)
            for (int j = 0; j + 1 < w[k].len; j++) {
                size_t pair = (size_t)w[k].ids[j] * max_ids + (size_t)w[k].ids[j + 1];
                if (banned[pair])
                    continue;
                if (counts[pair] == 0)
                    touched[n_touched++] = pair;
                counts[pair] += w[k].freq;
            }
        size_t best = SIZE_MAX;
        for (size_t t = 0; t < n_touched; t++) {
            size_t p = touched[t];
            if (best == SIZE_MAX || counts[p] > counts[best] ||
                (counts[p] == counts[best] && p < best))
                best = p;
        }
        for (size_t t = 0; t < n_touched; t++)
            counts[touched[t]] = 0;
        if (best == SIZE_MAX)
            break; /* every word is one token */
        int a = (int)(best / max_ids), b = (int)(best % max_ids);
        char *joined = vlmd_asprintf("%s%s", v->tokens[a], v->tokens[b]);
        VLMD_ASSERT(joined);
        if (vocab_find(v, joined) >= 0) {
            banned[best] = true;
            free(joined);
            continue;
        }
        int id = v->n++;
        v->tokens[id] = joined;
        v->merges[v->n_merges][0] = a;
        v->merges[v->n_merges][1] = b;
        v->n_merges++;
        apply_merge(w, nw, a, b, id);
    }
    free(touched);
    free(banned);
    free(counts);
    for (int k = 0; k < nw; k++)
        free(w[k].ids);
    free(w);
}

static void vocab_build(vocab *v)
{
    memset(v, 0, sizeof *v);
    v->tokens = calloc(256 + DEMO_MERGES, sizeof *v->tokens);
    v->merges = calloc(DEMO_MERGES, sizeof *v->merges);
    VLMD_ASSERT(v->tokens && v->merges);
    byte_symbols(v);
    learn_merges(v);
}

static void vocab_free(vocab *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->tokens[i]);
    free(v->tokens);
    free(v->merges);
}

/* config.json's vocab_size: every token, rounded up to 64 as Qwen pads its
 * embedding (the padding rows are never produced by the tokenizer). */
static int padded_vocab(const vocab *v)
{
    return (v->n + N_SPECIAL + 63) / 64 * 64;
}

/* ---- JSON files ---------------------------------------------------------- */

static json_t *tokenizer_json(const vocab *v)
{
    json_t *added = json_array(), *vocab_obj = json_object(), *merges = json_array();
    for (int i = 0; i < N_SPECIAL; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                               v->n + i, "content", special_tokens[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special",
                                               i < N_CONTROL));
    for (int i = 0; i < v->n; i++)
        json_object_set_new(vocab_obj, v->tokens[i], json_integer(i));
    for (int i = 0; i < v->n_merges; i++)
        json_array_append_new(merges, json_pack("[s, s]", v->tokens[v->merges[i][0]],
                                                v->tokens[v->merges[i][1]]));
    const char *regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    return json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s}, "
        "s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}, s:n, "
        "s:{s:s, s:b, s:b, s:b}, "
        "s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
        "NFC", "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern",
        "Regex", regex, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
        "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "post_processor",
        "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1,
        "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab",
        vocab_obj, "merges", merges);
}

static json_t *config_json(const vocab *v)
{
    int id0 = v->n; /* first special token */
    json_t *layer_types = json_array();
    for (int i = 0; i < DEMO_LAYERS; i++)
        json_array_append_new(layer_types, json_string("full_attention"));
    json_t *text = json_pack(
        "{s:f, s:i, s:i, s:s, s:i, s:f, s:i, s:o, s:i, s:i, s:s, s:i, s:i, s:i, s:n, s:f, "
        "s:{s:[i,i,i], s:f, s:s, s:s}, s:n, s:b, s:b, s:b, s:i}",
        "attention_dropout", 0.0, "bos_token_id", id0 + SPECIAL_ENDOFTEXT, "eos_token_id",
        id0 + SPECIAL_IM_END, "hidden_act", "silu", "hidden_size", DEMO_HIDDEN,
        "initializer_range", demo_init_std, "intermediate_size", DEMO_INTERMEDIATE,
        "layer_types", layer_types, "max_position_embeddings", DEMO_MAX_POSITIONS,
        "max_window_layers", DEMO_LAYERS, "model_type", "qwen2_vl_text", "num_attention_heads",
        DEMO_HEADS, "num_hidden_layers", DEMO_LAYERS, "num_key_value_heads", DEMO_KV_HEADS,
        "pad_token_id", "rms_norm_eps", 1e-6, "rope_parameters", "mrope_section",
        demo_mrope_section[0], demo_mrope_section[1], demo_mrope_section[2], "rope_theta",
        1000000.0, "rope_type", "default", "type", "mrope", "sliding_window",
        "tie_word_embeddings", 0, "use_cache", 1, "use_sliding_window", 0, "vocab_size",
        padded_vocab(v));
    json_t *vision = json_pack(
        "{s:i, s:i, s:s, s:i, s:i, s:f, s:i, s:s, s:i, s:i, s:{s:f, s:s}, s:i, s:i}",
        "depth", DEMO_VISION_DEPTH, "embed_dim", DEMO_VISION_WIDTH, "hidden_act", "quick_gelu",
        "hidden_size", DEMO_HIDDEN, "in_channels", 3, "initializer_range", demo_init_std,
        "mlp_ratio", DEMO_VISION_MLP_RATIO, "model_type", "qwen2_vl_vision", "num_heads",
        DEMO_VISION_HEADS, "patch_size", DEMO_PATCH, "rope_parameters", "rope_theta", 10000.0,
        "rope_type", "axial", "spatial_merge_size", DEMO_MERGE, "temporal_patch_size",
        DEMO_TEMPORAL_PATCH);
    return json_pack("{s:[s], s:s, s:i, s:s, s:o, s:b, s:s, s:i, s:o, s:i, s:i}",
                     "architectures", "Qwen2VLForConditionalGeneration", "dtype", "bfloat16",
                     "image_token_id", id0 + SPECIAL_IMAGE_PAD, "model_type", "qwen2_vl",
                     "text_config", text, "tie_word_embeddings", 0, "transformers_version",
                     "5.17.0", "video_token_id", id0 + SPECIAL_VIDEO_PAD, "vision_config",
                     vision, "vision_end_token_id", id0 + SPECIAL_VISION_END,
                     "vision_start_token_id", id0 + SPECIAL_VISION_START);
}

static json_t *tokenizer_config_json(const vocab *v)
{
    json_t *decoder = json_object();
    for (int i = 0; i < N_SPECIAL; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", v->n + i);
        json_object_set_new(decoder, id,
                            json_pack("{s:s, s:b}", "content", special_tokens[i], "special",
                                      i < N_CONTROL));
    }
    return json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:n, s:n, s:b, s:o}", "model_max_length",
                     DEMO_MAX_POSITIONS, "eos_token", special_tokens[SPECIAL_IM_END],
                     "pad_token", special_tokens[SPECIAL_ENDOFTEXT], "chat_format", "chatml",
                     "chat_template", demo_chat_template, "tokenizer_class", "Qwen2Tokenizer",
                     "bos_token", "unk_token", "clean_up_tokenization_spaces", 0,
                     "added_tokens_decoder", decoder);
}

static json_t *generation_config_json(const vocab *v)
{
    return json_pack("{s:i, s:i, s:b}", "bos_token_id", v->n + SPECIAL_ENDOFTEXT,
                     "eos_token_id", v->n + SPECIAL_IM_END, "use_cache", 1);
}

/* Both spellings of the pixel bounds: size.{shortest,longest}_edge (newer
 * transformers, as in the fixture) and min_pixels / max_pixels (older). */
static json_t *preprocessor_config_json(void)
{
    return json_pack("{s:b, s:b, s:b, s:b, s:[f,f,f], s:s, s:[f,f,f], s:i, s:i, s:i, s:i, s:i, "
                     "s:f, s:{s:i, s:i}, s:i}",
                     "do_convert_rgb", 1, "do_normalize", 1, "do_rescale", 1, "do_resize", 1,
                     "image_mean", 0.48145466, 0.4578275, 0.40821073, "image_processor_type",
                     "Qwen2VLImageProcessor", "image_std", 0.26862954, 0.26130258, 0.27577711,
                     "max_pixels", DEMO_MAX_PIXELS, "merge_size", DEMO_MERGE, "min_pixels",
                     DEMO_MIN_PIXELS, "patch_size", DEMO_PATCH, "resample", 3,
                     "rescale_factor", 1.0 / 255.0, "size", "longest_edge", DEMO_MAX_PIXELS,
                     "shortest_edge", DEMO_MIN_PIXELS, "temporal_patch_size",
                     DEMO_TEMPORAL_PATCH);
}

/* ---- files --------------------------------------------------------------- */

static vlmd_status path_join(char out[PATH_MAX], const char *dir, const char *prefix,
                             const char *name, vlmd_error *err)
{
    int n = snprintf(out, PATH_MAX, "%s/%s%s", dir, prefix, name);
    if (n < 0 || n >= PATH_MAX)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: path too long", dir);
    return VLMD_OK;
}

/* Writes data to dir/name through dir/.tmp-name and a rename, so a reader
 * never sees half a file. */
static vlmd_status write_file(const char *dir, const char *name, const void *data, size_t len,
                              vlmd_error *err)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    vlmd_status st = path_join(tmp, dir, ".tmp-", name, err);
    if (st == VLMD_OK)
        st = path_join(path, dir, "", name, err);
    if (st != VLMD_OK)
        return st;
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return VLMD_OK;
}

/* Serializes j (takes the reference) and writes it. Reals get 16 digits, so
 * 1e-6 reads "1e-6", not "9.9999999999999995e-7". */
static vlmd_status write_json(const char *dir, const char *name, json_t *j, vlmd_error *err)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(16))
                   : NULL;
    json_decref(j);
    if (!text)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "cannot render %s", name);
    vlmd_status st = write_file(dir, name, text, strlen(text), err);
    free(text);
    return st;
}

/* mkdir -p: creates dir and its missing parents. */
static vlmd_status make_dirs(const char *dir, vlmd_error *err)
{
    char path[PATH_MAX];
    if (vlmd_strlcpy(path, dir, sizeof path) >= sizeof path)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: path too long", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return vlmd_errorf(err, VLMD_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s is not a directory", dir);
    return VLMD_OK;
}

/* ---- weights ------------------------------------------------------------- */

typedef enum tensor_init { INIT_NORMAL, INIT_ONES, INIT_ZEROS } tensor_init;

typedef struct tensor_spec {
    char name[96];
    int ndim;
    int64_t shape[5];
    tensor_init init;
} tensor_spec;

typedef struct tensor_list {
    tensor_spec *t;     /* owned */
    size_t n, cap;
} tensor_list;

static void add_tensor(tensor_list *l, tensor_init init, const char *name, int ndim, int64_t d0,
                       int64_t d1, int64_t d2, int64_t d3, int64_t d4)
{
    l->t = vlmd_grow(l->t, l->n, &l->cap, sizeof *l->t, 64);
    VLMD_ASSERT(l->t);
    tensor_spec *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    int64_t dims[5] = {d0, d1, d2, d3, d4};
    memcpy(t->shape, dims, sizeof dims);
    t->init = init;
}

#define W2(l, name, a, b) add_tensor(l, INIT_NORMAL, name, 2, a, b, 0, 0, 0)
#define B1(l, name, a) add_tensor(l, INIT_ZEROS, name, 1, a, 0, 0, 0, 0)
#define N1(l, name, a) add_tensor(l, INIT_ONES, name, 1, a, 0, 0, 0, 0)

/* Every tensor of a Qwen2-VL checkpoint, with the demo's shapes. */
static void list_tensors(tensor_list *l, int vocab_size)
{
    char n[96];
    const int64_t H = DEMO_HIDDEN, I = DEMO_INTERMEDIATE, D = DEMO_HEAD_DIM;
    const int64_t Q = DEMO_HEADS * D, KV = DEMO_KV_HEADS * D;
    W2(l, "model.embed_tokens.weight", vocab_size, H);      /* [vocab, hidden] */
    W2(l, "lm_head.weight", vocab_size, H);                 /* [vocab, hidden], not tied */
    N1(l, "model.norm.weight", H);
    for (int i = 0; i < DEMO_LAYERS; i++) {
#define L(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
        N1(l, L("input_layernorm.weight"), H);
        N1(l, L("post_attention_layernorm.weight"), H);
        W2(l, L("self_attn.q_proj.weight"), Q, H);
        B1(l, L("self_attn.q_proj.bias"), Q);
        W2(l, L("self_attn.k_proj.weight"), KV, H);
        B1(l, L("self_attn.k_proj.bias"), KV);
        W2(l, L("self_attn.v_proj.weight"), KV, H);
        B1(l, L("self_attn.v_proj.bias"), KV);
        W2(l, L("self_attn.o_proj.weight"), H, Q);
        W2(l, L("mlp.gate_proj.weight"), I, H);
        W2(l, L("mlp.up_proj.weight"), I, H);
        W2(l, L("mlp.down_proj.weight"), H, I);
#undef L
    }
    const int64_t E = DEMO_VISION_WIDTH, M = E * DEMO_VISION_MLP_RATIO;
    const int64_t MERGED = E * DEMO_MERGE * DEMO_MERGE;
    /* [embed, channels, temporal, patch, patch]: a Conv3d without bias */
    add_tensor(l, INIT_NORMAL, "visual.patch_embed.proj.weight", 5, E, 3, DEMO_TEMPORAL_PATCH,
               DEMO_PATCH, DEMO_PATCH);
    for (int i = 0; i < DEMO_VISION_DEPTH; i++) {
#define V(suffix) (snprintf(n, sizeof n, "visual.blocks.%d.%s", i, suffix), n)
        N1(l, V("norm1.weight"), E);
        B1(l, V("norm1.bias"), E);
        N1(l, V("norm2.weight"), E);
        B1(l, V("norm2.bias"), E);
        W2(l, V("attn.qkv.weight"), 3 * E, E);
        B1(l, V("attn.qkv.bias"), 3 * E);
        W2(l, V("attn.proj.weight"), E, E);
        B1(l, V("attn.proj.bias"), E);
        W2(l, V("mlp.fc1.weight"), M, E);
        B1(l, V("mlp.fc1.bias"), M);
        W2(l, V("mlp.fc2.weight"), E, M);
        B1(l, V("mlp.fc2.bias"), E);
#undef V
    }
    N1(l, "visual.merger.ln_q.weight", E);
    B1(l, "visual.merger.ln_q.bias", E);
    W2(l, "visual.merger.mlp.0.weight", MERGED, MERGED);
    B1(l, "visual.merger.mlp.0.bias", MERGED);
    W2(l, "visual.merger.mlp.2.weight", H, MERGED);
    B1(l, "visual.merger.mlp.2.bias", H);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(((const tensor_spec *)a)->name, ((const tensor_spec *)b)->name);
}

static int64_t numel(const tensor_spec *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* splitmix64 (Steele, Lea, Flood 2014): the whole generator state is one
 * counter, so the seed alone fixes every weight. */
typedef struct demo_rng {
    uint64_t state;
    double spare;       /* Box-Muller's second normal, when has_spare */
    bool has_spare;
} demo_rng;

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A standard normal by Box-Muller from two uniforms, u1 in (0, 1] (log is
 * finite) and u2 in [0, 1); each pair gives two normals. */
static double rng_normal(demo_rng *r)
{
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u1 = ((double)(splitmix64(&r->state) >> 11) + 1.0) / 9007199254740992.0;
    double u2 = (double)(splitmix64(&r->state) >> 11) / 9007199254740992.0;
    double radius = sqrt(-2.0 * log(u1));
    r->spare = radius * sin(2.0 * M_PI * u2);
    r->has_spare = true;
    return radius * cos(2.0 * M_PI * u2);
}

/* float32 -> bfloat16 with round-to-nearest-even (the values are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Renders the safetensors header: tensors in l's order, each right after
 * the one before; *data_bytes gets the data section's size. The caller frees
 * the result. */
static char *safetensors_header(const tensor_list *l, uint64_t *data_bytes)
{
    json_t *header = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    uint64_t offset = 0;
    for (size_t i = 0; i < l->n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < l->t[i].ndim; d++)
            json_array_append_new(shape, json_integer(l->t[i].shape[d]));
        uint64_t bytes = (uint64_t)numel(&l->t[i]) * 2u;
        json_object_set_new(header, l->t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape,
                                      "data_offsets", (json_int_t)offset,
                                      (json_int_t)(offset + bytes)));
        offset += bytes;
    }
    char *text = json_dumps(header, JSON_COMPACT);
    json_decref(header);
    VLMD_ASSERT(text);
    *data_bytes = offset;
    return text;
}

/* model.safetensors: u64 LE header size, the JSON header padded with spaces
 * to a multiple of 8, then the tensors back to back. */
static vlmd_status write_weights(const char *dir, int vocab_size, uint64_t seed, vlmd_error *err)
{
    tensor_list l = {0};
    list_tensors(&l, vocab_size);
    qsort(l.t, l.n, sizeof *l.t, compare_names);
    uint64_t data_bytes;
    char *header = safetensors_header(&l, &data_bytes);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    size_t size = 8 + padded + data_bytes;
    uint8_t *file = malloc(size);
    if (!file) {
        free(header);
        free(l.t);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for %zu bytes of weights", size);
    }
    for (int k = 0; k < 8; k++)
        file[k] = (uint8_t)((uint64_t)padded >> (8 * k));
    memcpy(file + 8, header, hlen);
    memset(file + 8 + hlen, ' ', padded - hlen);
    uint8_t *p = file + 8 + padded;
    demo_rng rng = {seed, 0.0, false};
    for (size_t i = 0; i < l.n; i++) {
        const tensor_spec *t = &l.t[i];
        for (int64_t k = numel(t); k > 0; k--) {
            float v = t->init == INIT_ONES    ? 1.0f
                      : t->init == INIT_ZEROS ? 0.0f
                                              : (float)(demo_init_std * rng_normal(&rng));
            uint16_t h = to_bf16(v);
            *p++ = (uint8_t)h;
            *p++ = (uint8_t)(h >> 8);
        }
    }
    vlmd_status st = write_file(dir, "model.safetensors", file, size, err);
    free(file);
    free(header);
    free(l.t);
    return st;
}

/* ---- entry point --------------------------------------------------------- */

typedef enum dir_state {
    DIR_FREE,       /* none of our files: write */
    DIR_OURS,       /* our stamp, another seed or version, or incomplete: rewrite */
    DIR_SAME,       /* our stamp says this seed and version, and every file is there */
    DIR_FOREIGN,    /* our file names without our stamp: leave alone */
} dir_state;

/* Decides what dir holds; *clash names the file that makes it foreign. */
static dir_state dir_inspect(const char *dir, const char *want, const char **clash)
{
    char path[PATH_MAX];
    bool present[N_OUTPUTS], all = true, any = false;
    for (int i = 0; i < N_OUTPUTS; i++) {
        present[i] = path_join(path, dir, "", output_names[i], NULL) == VLMD_OK &&
                     access(path, F_OK) == 0;
        all = all && present[i];
        if (present[i] && !any) {
            any = true;
            *clash = output_names[i];
        }
    }
    vlmd_buf stamp = VLMD_BUF_INIT;
    bool ours = path_join(path, dir, "", stamp_name, NULL) == VLMD_OK &&
                vlmd_read_file(path, 1024, &stamp, NULL) == VLMD_OK &&
                strncmp(stamp.data, stamp_prefix, strlen(stamp_prefix)) == 0;
    bool same = ours && strcmp(stamp.data, want) == 0;
    vlmd_buf_free(&stamp);
    if (same && all)
        return DIR_SAME;
    if (ours)
        return DIR_OURS;
    return any ? DIR_FOREIGN : DIR_FREE;
}

vlmd_status vlmd_demo_model_write(const char *dir, uint64_t seed, bool *unchanged,
                                  vlmd_error *err)
{
    if (unchanged)
        *unchanged = false;
    char want[128], writing[160];
    snprintf(want, sizeof want, "%sv%d seed %llu\n", stamp_prefix, VLMD_DEMO_MODEL_VERSION,
             (unsigned long long)seed);
    snprintf(writing, sizeof writing, "%sv%d seed %llu (incomplete)\n", stamp_prefix,
             VLMD_DEMO_MODEL_VERSION, (unsigned long long)seed);
    const char *clash = NULL;
    switch (dir_inspect(dir, want, &clash)) {
    case DIR_SAME:
        if (unchanged)
            *unchanged = true;
        return VLMD_OK;
    case DIR_FOREIGN:
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "%s holds %s but is not a vlmd demo model (no %s); refusing to "
                           "overwrite it", dir, clash, stamp_name);
    case DIR_OURS:
    case DIR_FREE:
        break;
    }
    vlmd_status st = make_dirs(dir, err);
    if (st == VLMD_OK)
        st = write_file(dir, stamp_name, writing, strlen(writing), err);
    if (st != VLMD_OK)
        return st;

    vocab v;
    vocab_build(&v);
    st = write_json(dir, "tokenizer.json", tokenizer_json(&v), err);
    if (st == VLMD_OK)
        st = write_json(dir, "config.json", config_json(&v), err);
    if (st == VLMD_OK)
        st = write_json(dir, "tokenizer_config.json", tokenizer_config_json(&v), err);
    if (st == VLMD_OK)
        st = write_json(dir, "generation_config.json", generation_config_json(&v), err);
    if (st == VLMD_OK)
        st = write_json(dir, "preprocessor_config.json", preprocessor_config_json(), err);
    if (st == VLMD_OK)
        st = write_weights(dir, padded_vocab(&v), seed, err);
    if (st == VLMD_OK)
        st = write_file(dir, stamp_name, want, strlen(want), err);
    vocab_free(&v);
    return st;
}
