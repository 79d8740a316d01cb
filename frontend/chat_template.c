/* chat_template.c - the families' chat templates (see chat_template.h).
 * Three dialects write prompts (ChatML, GLM's, [INST]); each reads its
 * family's table entry, so what a family of a dialect does differently is a
 * field there, not a branch on its name. What the template writes itself
 * (markers, roles, the default system prompt, the frame of a think block, a
 * call or a result) is a trusted piece of the prompt; every text a request
 * brought is an untrusted one, whose special tokens stay text. */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pyjson.h"
#include "tools.h"

#define ARCH(a) (1u << (a))
#define QWEN25_SYSTEM_PROMPT "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define VISION_SLOT "<|vision_start|><|image_pad|><|vision_end|>"

static vlmd_status render_chatml(const vlmd_chat_family *f, const vlmd_chat_message *msgs,
                                 size_t n, const vlmd_chat_options *opt, vlmd_prompt_text *out,
                                 vlmd_error *err);
static vlmd_status render_glm(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                              const vlmd_chat_options *opt, vlmd_prompt_text *out,
                              vlmd_error *err);
static vlmd_status render_inst(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                               const vlmd_chat_options *opt, vlmd_prompt_text *out,
                               vlmd_error *err);

/* Checked in this order: a template is the first family whose signature it
 * holds (Qwen2's default system prompt is in no Qwen3 template, but in
 * Qwen2.5's longer one; the vision slot is in Qwen2-VL's too, which has that
 * prompt). GLM's and Mixtral's signatures are in no other's. */
#define OPENS_THINK "'<|im_start|>assistant\\n<think>\\n'" /* a Thinking model's template */
#define CHATML_OF(format) .render = render_chatml, .tools = (format), .image_slot = VISION_SLOT
#define CHATML CHATML_OF(&tool_format_hermes)
static const vlmd_chat_family families[] = {
    /* Qwen3.5's two published templates (before Qwen3's: they hold its signature too) */
    {.name = "qwen3_5", CHATML_OF(&tool_format_qwen3_coder), .default_system = NULL, .part_separator = "", .thinking = true,
     .think_switch = true, .think_off_by_default = true, .trim_turns = true,
     .think_after_query = true, .tools_first = true, .switch_opens_think = true,
     .strict_turns = true, .signature = {"<parameter=", "enable_thinking is true"}, .arches = 0},
    {.name = "qwen3_5_think", CHATML_OF(&tool_format_qwen3_coder), .default_system = NULL, .part_separator = "",
     .thinking = true, .think_switch = true, .trim_turns = true, .think_after_query = true,
     .tools_first = true, .switch_opens_think = true, .strict_turns = true,
     .signature = {"<parameter=", "enable_thinking is false"},
     .arches = ARCH(VLMD_ARCH_QWEN3_5) | ARCH(VLMD_ARCH_QWEN3_5_MOE)},
    {.name = "qwen3", CHATML, .default_system = NULL, .part_separator = "\n", .thinking = true,
     .think_switch = true, .later_system = true,
     .signature = {"enable_thinking", "<think>\\n\\n</think>\\n\\n"},
     .arches = ARCH(VLMD_ARCH_QWEN3) | ARCH(VLMD_ARCH_QWEN3_MOE)},
    {.name = "qwen3_vl_thinking", CHATML, .default_system = NULL, .part_separator = "",
     .thinking = true, .opens_think = true, .later_system = false,
     .signature = {VISION_SLOT, OPENS_THINK}, .arches = 0},
    {.name = "qwen3_thinking", CHATML, .default_system = NULL, .part_separator = "\n",
     .thinking = true, .opens_think = true, .later_system = true, .signature = {OPENS_THINK},
     .arches = 0},
    /* Qwen3-2507 Instruct's: Qwen3's handling of earlier reasoning, no switch */
    {.name = "qwen3_instruct", CHATML, .default_system = NULL, .part_separator = "\n",
     .thinking = true, .later_system = true, .signature = {"reasoning_content", "<|im_start|>"},
     .arches = 0},
    {.name = "qwen2_5", CHATML, .default_system = QWEN25_SYSTEM_PROMPT, .part_separator = "\n",
     .thinking = false, .later_system = true, .signature = {QWEN25_SYSTEM_PROMPT},
     .arches = 0}, /* Qwen2.5's text models: their architecture is Qwen2's */
    {.name = "qwen2", CHATML, .default_system = VLMD_DEFAULT_SYSTEM_PROMPT, .part_separator = "",
     .thinking = false, .later_system = true,
     .signature = {"<|im_start|>", VLMD_DEFAULT_SYSTEM_PROMPT},
     .arches = ARCH(VLMD_ARCH_QWEN2) | ARCH(VLMD_ARCH_QWEN2_VL) | ARCH(VLMD_ARCH_QWEN2_5_VL)},
    {.name = "qwen3_vl", CHATML, .default_system = NULL, .part_separator = "", .thinking = false,
     .later_system = false, .signature = {VISION_SLOT},
     .arches = ARCH(VLMD_ARCH_QWEN3_VL) | ARCH(VLMD_ARCH_QWEN3_VL_MOE)},
    /* GLM-4.5-Air's and GLM-4.6's (visible_text joins a turn's parts as they are) */
    {.name = "glm4_5", .render = render_glm, .tools = &tool_format_glm45, .image_slot = NULL,
     .part_separator = "", .thinking = true, .think_switch = true, .think_optional = true,
     .later_system = true, .signature = {"[gMASK]<sop>", "<arg_key>"},
     .arches = ARCH(VLMD_ARCH_GLM4_MOE)},
    /* Mixtral-8x7B-Instruct-v0.1's (message['content'] is one string: parts joined by "\n") */
    {.name = "mixtral", .render = render_inst, .tools = NULL, .image_slot = NULL,
     .part_separator = "\n", .signature = {"' [INST] '", "' [/INST]'"},
     .arches = ARCH(VLMD_ARCH_MIXTRAL)},
};
#define N_FAMILIES (sizeof families / sizeof families[0])
#define QWEN2 vlmd_chat_family_find("qwen2")

const vlmd_chat_family *vlmd_chat_family_find(const char *name)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(families[i].name, name) == 0)
            return &families[i];
    return NULL;
}

/* ---- which family a model is -------------------------------------------------- */

#define TEMPLATE_MAX_BYTES (1u << 20)

/* A JSON file's chat template: "chat_template" as a string, or the entry
 * named "default" of a list of {name, template}. Owned; NULL when none. */
static char *json_template(const char *path)
{
    json_t *j = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL); /* (Mixtral's
                                                   * model_max_length is 1e30: no int64) */
    const json_t *t = json_object_get(j, "chat_template");
    for (size_t i = 0; json_is_array(t) && i < json_array_size(t); i++) {
        const json_t *e = json_array_get(t, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && strcmp(name, "default") == 0)
            t = json_object_get(e, "template");
    }
    char *s = json_is_string(t) ? strdup(json_string_value(t)) : NULL;
    json_decref(j);
    return s;
}

static char *file_template(const char *path)
{
    vlmd_buf b = VLMD_BUF_INIT;
    if (vlmd_read_file(path, TEMPLATE_MAX_BYTES, &b, NULL) != VLMD_OK) {
        vlmd_buf_free(&b);
        return NULL;
    }
    return b.data;
}

static bool holds_signature(const char *template, const vlmd_chat_family *f)
{
    for (size_t k = 0; k < sizeof f->signature / sizeof f->signature[0]; k++)
        if (f->signature[k] && !strstr(template, f->signature[k]))
            return false;
    return true;
}

const vlmd_chat_family *vlmd_chat_family_for_model(const char *dir, vlmd_arch arch,
                                                   const char **source)
{
    static const char *const files[] = {"tokenizer_config.json", "chat_template.jinja",
                                        "chat_template.json"};
    for (size_t i = 0; dir && i < sizeof files / sizeof files[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        char *t = strstr(files[i], ".jinja") ? file_template(path) : json_template(path);
        if (!t)
            continue;
        const vlmd_chat_family *found = NULL;
        for (size_t k = 0; !found && k < N_FAMILIES; k++)
            if (holds_signature(t, &families[k]))
                found = &families[k];
        free(t);
        if (found) {
            if (source)
                *source = files[i];
            return found;
        }
        break; /* the model's template, unrecognised: its architecture decides */
    }
    if (source)
        *source = "architecture";
    for (size_t k = 0; k < N_FAMILIES; k++)
        if (families[k].arches & ARCH(arch))
            return &families[k];
    return QWEN2;
}

/* ---- writing the prompt: what every dialect uses ----------------------------------- */

/* Written by the template: its special tokens are ids. */
static vlmd_status marker(vlmd_prompt_text *out, const char *s)
{
    return vlmd_prompt_puts(out, VLMD_SPECIAL_MATCH, s);
}

/* From the request: its special tokens are text. */
static vlmd_status text(vlmd_prompt_text *out, const char *s, size_t len)
{
    return vlmd_prompt_add(out, VLMD_SPECIAL_SPLIT, s, len);
}

static bool role_is(const vlmd_chat_message *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

static bool role_known(const vlmd_chat_message *m)
{
    return role_is(m, "system") || role_is(m, "user") || role_is(m, "assistant") ||
           role_is(m, "tool");
}

static vlmd_status image_misplaced(const vlmd_chat_family *f, const vlmd_chat_message *m,
                                   size_t i, vlmd_error *err)
{
    for (size_t k = 0; k < m->n_parts; k++)
        if (m->parts[k].kind == VLMD_CHAT_IMAGE && (!f->image_slot || !role_is(m, "user")))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu].content[%zu]: %s", i, k,
                               f->image_slot ? "images are only allowed in user messages"
                                             : "this model's template has no place for images");
    return VLMD_OK;
}

/* A slice of a string */
typedef struct slice {
    const char *s;
    size_t len;
} slice;

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* A trim_turns family's turn without the whitespace at its two ends (Jinja's
 * |trim of the rendered content: an image slot is not whitespace): from
 * part *first at offset *head to part *last, whose text ends *tail early. */
static void trimmed_span(const vlmd_chat_family *f, const vlmd_chat_message *m, size_t *first,
                         size_t *head, size_t *last, size_t *tail)
{
    *first = *head = *tail = 0;
    *last = m->n_parts;
    if (!f->trim_turns || *f->part_separator) /* (a separator would be text to trim too) */
        return;
    for (; *first < m->n_parts; ++*first, *head = 0) {
        const vlmd_chat_part *p = &m->parts[*first];
        if (p->kind != VLMD_CHAT_TEXT)
            break;
        while (*head < p->len && is_space(p->text[*head]))
            ++*head;
        if (*head < p->len)
            break;
    }
    for (; *last > *first; --*last, *tail = 0) {
        const vlmd_chat_part *p = &m->parts[*last - 1];
        if (p->kind != VLMD_CHAT_TEXT)
            break;
        size_t from = *last - 1 == *first ? *head : 0;
        while (*tail < p->len - from && is_space(p->text[p->len - 1 - *tail]))
            ++*tail;
        if (*tail < p->len - from)
            break;
    }
}

/* Part k's text within the trimmed span */
static slice part_text(const vlmd_chat_message *m, size_t k, size_t first, size_t head,
                       size_t last, size_t tail)
{
    const vlmd_chat_part *p = &m->parts[k];
    size_t from = k == first ? head : 0, to = k + 1 == last ? p->len - tail : p->len;
    return (slice){p->text + from, to - from};
}

static vlmd_status render_parts(const vlmd_chat_family *f, const vlmd_chat_message *m,
                                vlmd_prompt_text *out)
{
    vlmd_status st = VLMD_OK;
    size_t first, head, last, tail;
    trimmed_span(f, m, &first, &head, &last, &tail);
    for (size_t k = first; k < last && st == VLMD_OK; k++) {
        if (k > first)
            st = text(out, f->part_separator, strlen(f->part_separator));
        if (st == VLMD_OK && m->parts[k].kind == VLMD_CHAT_TEXT) {
            slice t = part_text(m, k, first, head, last, tail);
            st = text(out, t.s, t.len);
        } else if (st == VLMD_OK) {
            st = marker(out, f->image_slot);
        }
    }
    return st;
}

/* A turn's text parts as the one string the template sees. */
static vlmd_status joined(const vlmd_chat_family *f, const vlmd_chat_message *m, vlmd_buf *b)
{
    vlmd_status st = vlmd_buf_puts(b, "");
    size_t first, head, last, tail;
    trimmed_span(f, m, &first, &head, &last, &tail);
    for (size_t k = first; k < last && st == VLMD_OK; k++) {
        if (k > first)
            st = vlmd_buf_puts(b, f->part_separator);
        if (st == VLMD_OK && m->parts[k].kind == VLMD_CHAT_TEXT) {
            slice t = part_text(m, k, first, head, last, tail);
            st = vlmd_buf_append(b, t.s, t.len);
        }
    }
    return st;
}

/* (trimmed of '\n' as Python's strip('\n') family does) */
static slice trim_space(slice x)
{
    while (x.len && is_space(x.s[0]))
        x.s++, x.len--;
    while (x.len && is_space(x.s[x.len - 1]))
        x.len--;
    return x;
}

static slice lstrip_nl(slice x)
{
    while (x.len && x.s[0] == '\n')
        x.s++, x.len--;
    return x;
}

static slice rstrip_nl(slice x)
{
    while (x.len && x.s[x.len - 1] == '\n')
        x.len--;
    return x;
}

/* Python's str.strip(): its whitespace at both ends. */
static slice strip(slice x)
{
    size_t lead = py_space_prefix(x.s, x.len);
    x.s += lead;
    x.len -= lead;
    x.len -= py_space_suffix(x.s, x.len);
    return x;
}

static const char *find_last(slice x, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t at = x.len >= n ? x.len - n + 1 : 0; at-- > 0;)
        if (memcmp(x.s + at, needle, n) == 0)
            return x.s + at;
    return NULL;
}

/* Qwen3's and GLM's templates split an assistant turn's text into reasoning
 * and content when it holds </think> and no reasoning_content came with it:
 * reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'),
 * content = text.split('</think>')[-1].lstrip('\n'). */
static void split_think(slice all, slice *reasoning, slice *content)
{
    const char *first = memmem(all.s, all.len, "</think>", 8);
    if (!first)
        return;
    slice r = rstrip_nl((slice){all.s, (size_t)(first - all.s)});
    const char *open = find_last(r, "<think>");
    if (open)
        r = (slice){open + 7, r.len - (size_t)(open + 7 - r.s)};
    *reasoning = lstrip_nl(r);
    const char *last = find_last(all, "</think>");
    *content = lstrip_nl((slice){last + 8, all.len - (size_t)(last + 8 - all.s)});
}

/* An assistant turn's reasoning (its reasoning_content, else its text's think
 * part) and content; content's slice points into *all (the caller frees it). */
static vlmd_status assistant_parts(const vlmd_chat_family *f, const vlmd_chat_message *m,
                                   vlmd_buf *all, slice *reasoning, slice *content)
{
    vlmd_status st = joined(f, m, all);
    *content = (slice){all->data, all->len};
    *reasoning = (slice){"", 0};
    if (m->reasoning)
        *reasoning = (slice){m->reasoning, m->reasoning_len};
    else
        split_think(*content, reasoning, content);
    return st;
}

static vlmd_status write_call(const vlmd_chat_family *f, const vlmd_chat_tool_call *c,
                              vlmd_prompt_text *out)
{
    return f->tools->write_call(c, out);
}

/* ---- ChatML: the Qwen families ------------------------------------------------------- */

/* An assistant turn: its text (a thinking family's think part kept only after
 * the last user query), then each call: the first after the format's
 * call_after_content where there is text, the others after "\n". */
static vlmd_status render_assistant(const vlmd_chat_family *f, const vlmd_chat_message *msgs,
                                    size_t n, size_t i, size_t last_query, vlmd_prompt_text *out)
{
    const vlmd_chat_message *m = &msgs[i];
    vlmd_buf all = VLMD_BUF_INIT;
    vlmd_status st = marker(out, "<|im_start|>assistant\n");
    bool has_content = false;
    slice content, reasoning;
    if (st == VLMD_OK && !f->thinking) {
        for (size_t k = 0; k < m->n_parts; k++)
            has_content = has_content || m->parts[k].len > 0;
        st = render_parts(f, m, out);
    } else if (st == VLMD_OK &&
               (st = assistant_parts(f, m, &all, &reasoning, &content)) == VLMD_OK) {
        has_content = content.len > 0;
        /* the last turn gets its think block even when empty, where the model thinks
         * (Qwen3-2507 Instruct's template writes one only for reasoning) */
        bool thinks = f->think_switch || f->opens_think;
        if (i > last_query && ((i + 1 == n && thinks) || reasoning.len > 0 ||
                               f->think_after_query)) {
            slice r = f->trim_turns ? trim_space(reasoning) : rstrip_nl(lstrip_nl(reasoning));
            slice c = lstrip_nl(content);
            if ((st = marker(out, "<think>\n")) == VLMD_OK &&
                (st = text(out, r.s, r.len)) == VLMD_OK &&
                (st = marker(out, "\n</think>\n\n")) == VLMD_OK)
                st = text(out, c.s, c.len);
        } else {
            st = text(out, content.s, content.len);
        }
    }
    vlmd_buf_free(&all);
    for (size_t k = 0; k < m->n_tool_calls && st == VLMD_OK; k++)
        if ((k == 0 && !has_content) ||
            (st = marker(out, k == 0 ? f->tools->call_after_content : "\n")) == VLMD_OK)
            st = write_call(f, &m->tool_calls[k], out);
    return st == VLMD_OK ? marker(out, "<|im_end|>\n") : st;
}

/* The index of the last user turn that is a query (not tool results the
 * client wrote as a user turn); n when there is none. */
static size_t find_user_query(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                              vlmd_status *st)
{
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    for (size_t i = n; i-- > 0;) {
        if (!role_is(&msgs[i], "user"))
            continue;
        vlmd_buf b = VLMD_BUF_INIT;
        if ((*st = joined(f, &msgs[i], &b)) != VLMD_OK) {
            vlmd_buf_free(&b);
            return n;
        }
        bool results = b.len >= sizeof close - 1 && strncmp(b.data, open, sizeof open - 1) == 0 &&
                       memcmp(b.data + b.len - (sizeof close - 1), close, sizeof close - 1) == 0;
        vlmd_buf_free(&b);
        if (!results)
            return i;
    }
    return n;
}

/* The system turn: a leading system message's text (else the family's
 * default), then the tools section; nothing when there is neither. */
static vlmd_status render_system(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                                 const vlmd_prompt_text *tools, vlmd_prompt_text *out)
{
    bool leading = n > 0 && role_is(&msgs[0], "system");
    if (!leading && !f->default_system && !tools)
        return VLMD_OK;
    vlmd_status st = marker(out, "<|im_start|>system\n");
    if (f->tools_first && tools) { /* then the system text, where there is any */
        vlmd_buf b = VLMD_BUF_INIT;
        if (st == VLMD_OK && leading)
            st = joined(f, &msgs[0], &b);
        if (st == VLMD_OK)
            st = vlmd_prompt_append(out, tools);
        if (st == VLMD_OK && b.len && (st = marker(out, "\n\n")) == VLMD_OK)
            st = render_parts(f, &msgs[0], out);
        vlmd_buf_free(&b);
        return st == VLMD_OK ? marker(out, "<|im_end|>\n") : st;
    }
    if (st == VLMD_OK && leading)
        st = render_parts(f, &msgs[0], out);
    else if (st == VLMD_OK && f->default_system)
        st = marker(out, f->default_system);
    if (st == VLMD_OK && tools && (leading || f->default_system))
        st = marker(out, "\n\n");
    if (st == VLMD_OK && tools)
        st = vlmd_prompt_append(out, tools);
    return st == VLMD_OK ? marker(out, "<|im_end|>\n") : st;
}

/* find_user_query's, or n - 1 when there is none, as in Qwen3's template */
static size_t last_user_query(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                              vlmd_status *st)
{
    size_t q = find_user_query(f, msgs, n, st);
    return q < n ? q : n - 1;
}

/* What Qwen3.5's template raises on: a system turn after the first, and a
 * chat with no user query (only tool results, or no user turn). */
static vlmd_status strict_turns(const vlmd_chat_family *f, const vlmd_chat_message *msgs,
                                size_t n, vlmd_error *err)
{
    for (size_t i = 1; i < n; i++)
        if (role_is(&msgs[i], "system"))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu]: a system message "
                               "must be the first (the %s chat template raises)", i, f->name);
    vlmd_status st = VLMD_OK;
    if (find_user_query(f, msgs, n, &st) == n && st == VLMD_OK)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages: no user query (the %s chat "
                           "template raises)", f->name);
    return st;
}

static vlmd_status render_chatml(const vlmd_chat_family *f, const vlmd_chat_message *msgs,
                                 size_t n, const vlmd_chat_options *opt, vlmd_prompt_text *out,
                                 vlmd_error *err)
{
    vlmd_status st = f->strict_turns ? strict_turns(f, msgs, n, err) : VLMD_OK;
    if (st == VLMD_OK)
        st = render_system(f, msgs, n, opt->tools, out);
    size_t last_query = f->thinking && st == VLMD_OK ? last_user_query(f, msgs, n, &st) : 0;
    for (size_t i = n > 0 && role_is(&msgs[0], "system") ? 1 : 0; i < n && st == VLMD_OK; i++) {
        const vlmd_chat_message *m = &msgs[i];
        if (role_is(m, "assistant")) {
            st = render_assistant(f, msgs, n, i, last_query, out);
        } else if (role_is(m, "tool")) { /* consecutive results: one user turn */
            if (i == 0 || !role_is(&msgs[i - 1], "tool"))
                st = marker(out, "<|im_start|>user");
            if (st == VLMD_OK && (st = marker(out, "\n<tool_response>\n")) == VLMD_OK &&
                (st = render_parts(f, m, out)) == VLMD_OK)
                st = marker(out, "\n</tool_response>");
            if (st == VLMD_OK && (i + 1 == n || !role_is(&msgs[i + 1], "tool")))
                st = marker(out, "<|im_end|>\n");
        } else if (f->later_system || !role_is(m, "system")) { /* user, or system */
            if ((st = marker(out, "<|im_start|>")) == VLMD_OK &&
                (st = marker(out, m->role)) == VLMD_OK && (st = marker(out, "\n")) == VLMD_OK &&
                (st = render_parts(f, m, out)) == VLMD_OK)
                st = marker(out, "<|im_end|>\n");
        }
    }
    if (st == VLMD_OK && opt->add_generation_prompt)
        st = marker(out, "<|im_start|>assistant\n");
    if (st == VLMD_OK && opt->add_generation_prompt && f->think_switch && !opt->enable_thinking)
        st = marker(out, "<think>\n\n</think>\n\n");
    bool opens = f->opens_think || (f->switch_opens_think && opt->enable_thinking);
    if (st == VLMD_OK && opt->add_generation_prompt && opens)
        st = marker(out, opt->call_forced ? "<think>\n\n</think>\n\n" : "<think>\n");
    return st;
}

/* ---- GLM's: GLM-4.5, 4.6 ----------------------------------------------------------- */

#define NOTHINK "/nothink"

/* A user turn: its text, then /nothink when thinking is off and the text
 * does not end with it already. A /nothink the text ends with is written as
 * the template's token (GLM's own per-turn switch; it can end no turn). */
static vlmd_status glm_user(const vlmd_chat_family *f, const vlmd_chat_message *m, bool thinking,
                            vlmd_prompt_text *out)
{
    vlmd_buf all = VLMD_BUF_INIT;
    vlmd_status st = joined(f, m, &all);
    const size_t k = strlen(NOTHINK);
    bool ends = all.len >= k && memcmp(all.data + all.len - k, NOTHINK, k) == 0;
    if (st == VLMD_OK && (st = marker(out, "<|user|>\n")) == VLMD_OK)
        st = text(out, all.data, ends ? all.len - k : all.len);
    if (st == VLMD_OK && (ends || !thinking))
        st = marker(out, NOTHINK);
    vlmd_buf_free(&all);
    return st;
}

/* An assistant turn: \n<think>R</think> with its reasoning kept only after
 * the last user turn (else empty), \nCONTENT when it has some, then each
 * call as \n<tool_call>...; reasoning and content stripped. */
static vlmd_status glm_assistant(const vlmd_chat_family *f, const vlmd_chat_message *m,
                                 bool keep_reasoning, vlmd_prompt_text *out)
{
    vlmd_buf all = VLMD_BUF_INIT;
    slice reasoning, content;
    vlmd_status st = assistant_parts(f, m, &all, &reasoning, &content);
    if (st == VLMD_OK)
        st = marker(out, "<|assistant|>");
    if (st == VLMD_OK && keep_reasoning && reasoning.len > 0) {
        slice r = strip(reasoning);
        if ((st = marker(out, "\n<think>")) == VLMD_OK && (st = text(out, r.s, r.len)) == VLMD_OK)
            st = marker(out, "</think>");
    } else if (st == VLMD_OK) {
        st = marker(out, "\n<think></think>");
    }
    content = strip(content);
    if (st == VLMD_OK && content.len > 0 && (st = marker(out, "\n")) == VLMD_OK)
        st = text(out, content.s, content.len);
    for (size_t k = 0; k < m->n_tool_calls && st == VLMD_OK; k++)
        if ((st = marker(out, "\n")) == VLMD_OK)
            st = write_call(f, &m->tool_calls[k], out);
    vlmd_buf_free(&all);
    return st;
}

/* [gMASK]<sop>, the tools as a system turn, then each message as its role's
 * marker, "\n" and its text (no end token); consecutive tool results share
 * one <|observation|>, each a <tool_response> block; the generation prompt
 * is <|assistant|>, closing an empty think block when thinking is off or a
 * call is forced (the call then starts on the next line). */
static vlmd_status render_glm(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                              const vlmd_chat_options *opt, vlmd_prompt_text *out,
                              vlmd_error *err)
{
    (void)err;
    vlmd_status st = marker(out, "[gMASK]<sop>");
    if (st == VLMD_OK && opt->tools && (st = marker(out, "<|system|>\n")) == VLMD_OK)
        st = vlmd_prompt_append(out, opt->tools);
    size_t last_user = SIZE_MAX; /* none: every assistant turn is after it */
    for (size_t i = 0; i < n; i++)
        if (role_is(&msgs[i], "user"))
            last_user = i;
    for (size_t i = 0; i < n && st == VLMD_OK; i++) {
        const vlmd_chat_message *m = &msgs[i];
        if (role_is(m, "user")) {
            st = glm_user(f, m, opt->enable_thinking, out);
        } else if (role_is(m, "assistant")) {
            st = glm_assistant(f, m, last_user == SIZE_MAX || i > last_user, out);
        } else if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool"))
                st = marker(out, "<|observation|>");
            if (st == VLMD_OK && (st = marker(out, "\n<tool_response>\n")) == VLMD_OK &&
                (st = render_parts(f, m, out)) == VLMD_OK)
                st = marker(out, "\n</tool_response>");
        } else if ((st = marker(out, "<|system|>\n")) == VLMD_OK) {
            st = render_parts(f, m, out);
        }
    }
    if (st == VLMD_OK && opt->add_generation_prompt)
        st = marker(out, "<|assistant|>");
    if (st == VLMD_OK && opt->add_generation_prompt && (!opt->enable_thinking || opt->call_forced))
        st = marker(out, "\n<think></think>");
    if (st == VLMD_OK && opt->add_generation_prompt && opt->call_forced)
        st = marker(out, "\n");
    return st;
}

/* ---- [INST]: Mixtral-8x7B-Instruct -------------------------------------------------- */

/* <s>, then the turns after an optional first system message, which must
 * alternate user, assistant, user, ... (the template raises otherwise):
 * " [INST] TEXT [/INST]" (the first with the system text and "\n\n" before
 * its own) and " TEXT</s>"; nothing for the generation prompt. */
static vlmd_status render_inst(const vlmd_chat_family *f, const vlmd_chat_message *msgs, size_t n,
                               const vlmd_chat_options *opt, vlmd_prompt_text *out,
                               vlmd_error *err)
{
    (void)opt;
    size_t first = n > 0 && role_is(&msgs[0], "system") ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        const vlmd_chat_message *m = &msgs[i];
        bool user = role_is(m, "user"), turn_of_user = (i - first) % 2 == 0;
        if (user != turn_of_user)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages: after an optional first "
                               "system message, roles must alternate user, assistant, user, ... "
                               "(this model's template raises otherwise); messages[%zu] is %s "
                               "where %s is due", i, m->role, turn_of_user ? "user" : "assistant");
        if (!user && !role_is(m, "assistant"))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu].role: this model's "
                               "template has only user and assistant turns (and a first system "
                               "message), not '%s'", i, m->role);
        if (m->n_tool_calls)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu].tool_calls: this "
                               "model's template writes no calls", i);
    }
    vlmd_status st = marker(out, "<s>");
    for (size_t i = first; i < n && st == VLMD_OK; i++) {
        const vlmd_chat_message *m = &msgs[i];
        if (role_is(m, "assistant")) {
            if ((st = marker(out, " ")) == VLMD_OK && (st = render_parts(f, m, out)) == VLMD_OK)
                st = marker(out, "</s>");
            continue;
        }
        st = marker(out, " [INST] ");
        bool folded = i == first && first; /* the system text, before the first user's */
        if (st == VLMD_OK && folded && (st = render_parts(f, &msgs[0], out)) == VLMD_OK)
            st = marker(out, "\n\n");
        if (st == VLMD_OK && (st = render_parts(f, m, out)) == VLMD_OK)
            st = marker(out, " [/INST]");
    }
    return st;
}

/* ---- the entry points ------------------------------------------------------------------ */

vlmd_status vlmd_chat_render_with(const vlmd_chat_message *msgs, size_t n,
                                  const vlmd_chat_options *opt, vlmd_prompt_text *out,
                                  vlmd_error *err)
{
    const vlmd_chat_family *f = opt->family ? opt->family : QWEN2;
    for (size_t i = 0; i < n; i++) {
        if (!role_known(&msgs[i]))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu].role: '%s' is not "
                               "system, user, assistant or tool", i, msgs[i].role);
        vlmd_status st = image_misplaced(f, &msgs[i], i, err);
        if (st != VLMD_OK)
            return st;
    }
    vlmd_status st = f->render(f, msgs, n, opt, out, err);
    if (st == VLMD_ERR_INVALID_ARG)
        return st; /* (err says which message) */
    return st == VLMD_OK ? VLMD_OK : vlmd_errorf(err, st, "out of memory rendering the prompt");
}

vlmd_status vlmd_chat_render(const vlmd_chat_message *msgs, size_t n, bool add_generation_prompt,
                             vlmd_prompt_text *out, vlmd_error *err)
{
    vlmd_chat_options opt = {.add_generation_prompt = add_generation_prompt};
    return vlmd_chat_render_with(msgs, n, &opt, out, err);
}
