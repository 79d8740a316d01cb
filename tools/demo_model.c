/* demo_model.c - the demo model generator (see demo_model.h).
 *
 *   1. tokenizer: the 256 byte-level symbols (GPT-2's bytes_to_unicode
 *      order, as Qwen's tokenizer.json has them), then BPE merges learned
 *      from demo_corpus.h, then the 14 Qwen special tokens;
 *   2. config: Qwen2-VL in the nested text_config / rope_parameters shape;
 *   3. weights: every tensor a Qwen2-VL checkpoint has, N(0, 0.02) from a
 *      seeded splitmix64 (norm weights 1, biases 0), rounded to BF16.
 * Files are written to DIR/.tmp-NAME and renamed; the stamp file comes last,
 * so an interrupted run is redone the next time. */
#include "demo_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "buf.h"
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
};
static const int demo_mrope_section[3] = {4, 6, 6}; /* sums to DEMO_HEAD_DIM / 2 */

static const char *const special_tokens[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
};
#define N_SPECIAL (int)(sizeof special_tokens / sizeof special_tokens[0])

static const char stamp_name[] = ".vlmd-demo-model";

/* ---- byte-level BPE training --------------------------------------------- */

typedef struct vocab {
    char **tokens;      /* id -> UTF-8 of the byte-level symbols; owned */
    int n;
    int (*merges)[2];   /* rank -> the two ids merged */
    int n_merges;
    int byte_id[256];   /* byte -> id of its symbol */
} vocab;

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
 * U+0100 onwards; ids follow that order (printable bytes first). */
static void byte_symbols(vocab *v)
{
    int order[256], n = 0;
    unsigned code[256];
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
            order[n] = b;
            code[n++] = (unsigned)b;
        }
    int extra = 0;
    for (int b = 0; b < 256; b++)
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
            order[n] = b;
            code[n++] = 256u + (unsigned)extra++;
        }
    for (int i = 0; i < 256; i++) {
        char utf8[4] = {0};
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
    int *ids;
    int len;
    int freq;
} word;

/* Splits the corpus into distinct pre-tokens with their counts. */
static word *corpus_words(const vocab *v, int *n_out)
{
    const unsigned char *s = (const unsigned char *)demo_corpus;
    size_t n = sizeof demo_corpus - 1, cap = 1024;
    word *w = calloc(cap, sizeof *w);
    int nw = 0;
    VLMD_ASSERT(w);
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

/* Learns up to DEMO_MERGES merges: each round merges the most frequent
 * adjacent pair (ties: the lowest ids), until every word is one token. The
 * corpus is small, so a plain count per round is fast enough. */
static void learn_merges(vocab *v)
{
    int nw;
    word *w = corpus_words(v, &nw);
    int max_ids = 256 + DEMO_MERGES;
    int *counts = malloc((size_t)max_ids * (size_t)max_ids * sizeof *counts);
    VLMD_ASSERT(counts);
    for (int round = 0; round < DEMO_MERGES; round++) {
        memset(counts, 0, (size_t)v->n * (size_t)max_ids * sizeof *counts);
        for (int k = 0; k < nw; k++)
            for (int j = 0; j + 1 < w[k].len; j++)
                counts[w[k].ids[j] * max_ids + w[k].ids[j + 1]] += w[k].freq;
        int best = -1, best_count = 0;
        for (int p = 0; p < v->n * max_ids; p++)
            if (counts[p] > best_count) {
                best = p;
                best_count = counts[p];
            }
        if (best < 0)
            break;
        int a = best / max_ids, b = best % max_ids;
        char *joined = vlmd_asprintf("%s%s", v->tokens[a], v->tokens[b]);
        VLMD_ASSERT(joined);
        int id = vocab_find(v, joined);
        if (id < 0) {
            id = v->n++;
            v->tokens[id] = joined;
        } else {
            free(joined);
        }
        v->merges[v->n_merges][0] = a;
        v->merges[v->n_merges][1] = b;
        v->n_merges++;
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

/* config.json's vocab_size: every token, rounded up to 64 as Qwen pads it. */
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
                                               "normalized", 0, "special", 1));
    for (int i = 0; i < v->n; i++)
        json_object_set_new(vocab_obj, v->tokens[i], json_integer(i));
    for (int i = 0; i < v->n_merges; i++)
        json_array_append_new(merges, json_pack("[s, s]", v->tokens[v->merges[i][0]],
                                                v->tokens[v->merges[i][1]]));
    const char *regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    return json_pack(
        "{s:s, s:n, s:n, s:o, s:n, "
        "s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}, s:n, "
        "s:{s:s, s:b, s:b, s:b}, "
        "s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
        "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern",
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
        "attention_dropout", 0.0, "bos_token_id", id0, "eos_token_id", id0 + 2, "hidden_act",
        "silu", "hidden_size", DEMO_HIDDEN, "initializer_range", 0.02, "intermediate_size",
        DEMO_INTERMEDIATE, "layer_types", layer_types, "max_position_embeddings",
        DEMO_MAX_POSITIONS, "max_window_layers", DEMO_LAYERS, "model_type", "qwen2_vl_text",
        "num_attention_heads", DEMO_HEADS, "num_hidden_layers", DEMO_LAYERS,
        "num_key_value_heads", DEMO_KV_HEADS, "pad_token_id", "rms_norm_eps", 1e-6,
        "rope_parameters", "mrope_section", demo_mrope_section[0], demo_mrope_section[1],
        demo_mrope_section[2], "rope_theta", 1000000.0, "rope_type", "default", "type", "mrope",
        "sliding_window", "tie_word_embeddings", 0, "use_cache", 1, "use_sliding_window", 0,
        "vocab_size", padded_vocab(v));
    json_t *vision = json_pack(
        "{s:i, s:i, s:s, s:i, s:i, s:f, s:i, s:s, s:i, s:i, s:{s:f, s:s}, s:i, s:i}",
        "depth", DEMO_VISION_DEPTH, "embed_dim", DEMO_VISION_WIDTH, "hidden_act", "quick_gelu",
        "hidden_size", DEMO_HIDDEN, "in_channels", 3, "initializer_range", 0.02, "mlp_ratio",
        DEMO_VISION_MLP_RATIO, "model_type", "qwen2_vl_vision", "num_heads", DEMO_VISION_HEADS,
        "patch_size", DEMO_PATCH, "rope_parameters", "rope_theta", 10000.0, "rope_type", "axial",
        "spatial_merge_size", DEMO_MERGE, "temporal_patch_size", DEMO_TEMPORAL_PATCH);
    return json_pack("{s:[s], s:s, s:i, s:s, s:o, s:b, s:s, s:i, s:o, s:i, s:i}",
                     "architectures", "Qwen2VLForConditionalGeneration", "dtype", "bfloat16",
                     "image_token_id", id0 + 12, "model_type", "qwen2_vl", "text_config", text,
                     "tie_word_embeddings", 0, "transformers_version", "5.17.0",
                     "video_token_id", id0 + 13, "vision_config", vision, "vision_end_token_id",
                     id0 + 10, "vision_start_token_id", id0 + 9);
}

static json_t *tokenizer_config_json(const vocab *v)
{
    json_t *decoder = json_object();
    for (int i = 0; i < N_SPECIAL; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", v->n + i);
        json_object_set_new(decoder, id,
                            json_pack("{s:s, s:b}", "content", special_tokens[i], "special", 1));
    }
    return json_pack("{s:i, s:s, s:s, s:s, s:o}", "model_max_length", DEMO_MAX_POSITIONS,
                     "eos_token", "<|im_end|>", "pad_token", "<|endoftext|>", "chat_format",
                     "chatml", "added_tokens_decoder", decoder);
}

static json_t *generation_config_json(const vocab *v)
{
    return json_pack("{s:i, s:i, s:b}", "bos_token_id", v->n, "eos_token_id", v->n + 2,
                     "use_cache", 1);
}

static json_t *preprocessor_config_json(void)
{
    return json_pack("{s:b, s:b, s:b, s:b, s:[f,f,f], s:s, s:[f,f,f], s:i, s:i, s:i, s:f, "
                     "s:{s:i, s:i}, s:i}",
                     "do_convert_rgb", 1, "do_normalize", 1, "do_rescale", 1, "do_resize", 1,
                     "image_mean", 0.48145466, 0.4578275, 0.40821073, "image_processor_type",
                     "Qwen2VLImageProcessor", "image_std", 0.26862954, 0.26130258, 0.27577711,
                     "merge_size", DEMO_MERGE, "patch_size", DEMO_PATCH, "resample", 3,
                     "rescale_factor", 1.0 / 255.0, "size", "longest_edge", 1003520,
                     "shortest_edge", 3136, "temporal_patch_size", DEMO_TEMPORAL_PATCH);
}

/* ---- files --------------------------------------------------------------- */

/* Writes data to dir/name through a temporary file and a rename. */
static vlmd_status write_file(const char *dir, const char *name, const void *data, size_t len,
                              vlmd_error *err)
{
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    return VLMD_OK;
}

/* Serializes j (takes the reference) and writes it. */
static vlmd_status write_json(const char *dir, const char *name, json_t *j, vlmd_error *err)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    if (!text)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "cannot render %s", name);
    vlmd_status st = write_file(dir, name, text, strlen(text), err);
    free(text);
    return st;
}

/* ---- weights ------------------------------------------------------------- */

typedef struct tensor_spec {
    char name[96];
    int ndim;
    int64_t shape[5];
    enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init;
} tensor_spec;

typedef struct tensor_list {
    tensor_spec *t;
    int n, cap;
} tensor_list;

static void add_tensor(tensor_list *l, int init, const char *name, int ndim, int64_t d0, int64_t d1,
                       int64_t d2, int64_t d3, int64_t d4)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
        VLMD_ASSERT(l->t);
    }
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
    W2(l, "model.embed_tokens.weight", vocab_size, H);
    W2(l, "lm_head.weight", vocab_size, H);
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

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A standard normal by Box-Muller from two uniforms in (0, 1]. */
static double normal(uint64_t *state)
{
    double u1 = ((double)(splitmix64(state) >> 11) + 1.0) / 9007199254740992.0;
    double u2 = (double)(splitmix64(state) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* float32 -> bfloat16 with round-to-nearest-even (the values are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static vlmd_status write_weights(const char *dir, int vocab_size, uint64_t seed, vlmd_error *err)
{
    tensor_list l = {0};
    list_tensors(&l, vocab_size);
    qsort(l.t, (size_t)l.n, sizeof *l.t, compare_names);
    json_t *header = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    uint64_t offset = 0;
    for (int i = 0; i < l.n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < l.t[i].ndim; d++)
            json_array_append_new(shape, json_integer(l.t[i].shape[d]));
        uint64_t bytes = (uint64_t)numel(&l.t[i]) * 2u;
        json_object_set_new(header, l.t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape,
                                      "data_offsets", (json_int_t)offset,
                                      (json_int_t)(offset + bytes)));
        offset += bytes;
    }
    char *htext = json_dumps(header, JSON_COMPACT);
    json_decref(header);
    VLMD_ASSERT(htext);
    size_t hlen = strlen(htext), padded = (hlen + 7) / 8 * 8;
    vlmd_buf file = VLMD_BUF_INIT;
    vlmd_status st = vlmd_buf_reserve(&file, 8 + padded + offset);
    if (st == VLMD_OK) {
        uint8_t le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (uint8_t)((uint64_t)padded >> (8 * k));
        vlmd_buf_append(&file, le, 8);
        vlmd_buf_append(&file, htext, hlen);
        for (size_t k = hlen; k < padded; k++)
            vlmd_buf_append(&file, " ", 1);
        uint64_t rng = seed;
        for (int i = 0; i < l.n; i++) {
            int64_t count = numel(&l.t[i]);
            for (int64_t k = 0; k < count; k++) {
                float v = l.t[i].init == INIT_ONES ? 1.0f
                          : l.t[i].init == INIT_ZEROS ? 0.0f
                                                       : (float)(0.02 * normal(&rng));
                uint16_t h = to_bf16(v);
                uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
                vlmd_buf_append(&file, b, 2);
            }
        }
        st = write_file(dir, "model.safetensors", file.data, file.len, err);
    } else {
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for %llu bytes of weights",
                         (unsigned long long)offset);
    }
    vlmd_buf_free(&file);
    free(htext);
    free(l.t);
    return st;
}

/* ---- entry point --------------------------------------------------------- */

vlmd_status vlmd_demo_model_write(const char *dir, uint64_t seed, bool *unchanged,
                                  vlmd_error *err)
{
    *unchanged = false;
    char stamp_path[4096], config_path[4096], want[128];
    snprintf(stamp_path, sizeof stamp_path, "%s/%s", dir, stamp_name);
    snprintf(config_path, sizeof config_path, "%s/config.json", dir);
    snprintf(want, sizeof want, "vlmd demo model v%d seed %llu\n", VLMD_DEMO_MODEL_VERSION,
             (unsigned long long)seed);
    vlmd_buf have = VLMD_BUF_INIT;
    if (vlmd_read_file(stamp_path, 1024, &have, NULL) == VLMD_OK) {
        bool same = strcmp(have.data, want) == 0;
        vlmd_buf_free(&have);
        if (same) {
            *unchanged = true;
            return VLMD_OK;
        }
        /* an older demo model (or another seed): ours to replace */
    } else if (access(config_path, F_OK) == 0) {
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "%s holds a model that is not a vlmd demo model; refusing to overwrite "
                           "it", dir);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    unlink(stamp_path);

    vocab v;
    vocab_build(&v);
    vlmd_status st = write_json(dir, "tokenizer.json", tokenizer_json(&v), err);
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
