/* chat_template.c - ChatML for the Qwen family (see chat_template.h). What the
 * template writes itself (markers, roles, the default system prompt, the
 * frame of a call or a result) is a trusted piece of the prompt; every text a
 * request brought is an untrusted one, whose special tokens stay text. */
#include "chat_template.h"

#include <string.h>

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

static bool role_known(const char *role)
{
    return strcmp(role, "system") == 0 || strcmp(role, "user") == 0 ||
           strcmp(role, "assistant") == 0 || strcmp(role, "tool") == 0;
}

static vlmd_status render_parts(const vlmd_chat_message *m, size_t i, vlmd_prompt_text *out,
                                vlmd_error *err)
{
    vlmd_status st = VLMD_OK;
    for (size_t k = 0; k < m->n_parts && st == VLMD_OK; k++) {
        if (m->parts[k].kind == VLMD_CHAT_TEXT)
            st = text(out, m->parts[k].text, m->parts[k].len);
        else if (strcmp(m->role, "user") == 0)
            st = marker(out, "<|vision_start|><|image_pad|><|vision_end|>");
        else
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu].content[%zu]: images "
                               "are only allowed in user messages", i, k);
    }
    return st;
}

static bool has_text(const vlmd_chat_message *m)
{
    for (size_t k = 0; k < m->n_parts; k++)
        if (m->parts[k].len)
            return true;
    return false;
}

/* An assistant turn with calls: its text (when any), then each call. */
static vlmd_status render_calls(const vlmd_chat_message *m, size_t i, vlmd_prompt_text *out,
                                vlmd_error *err)
{
    vlmd_status st = marker(out, "<|im_start|>assistant");
    if (st == VLMD_OK && has_text(m) && (st = marker(out, "\n")) == VLMD_OK)
        st = render_parts(m, i, out, err);
    for (size_t k = 0; k < m->n_tool_calls && st == VLMD_OK; k++) {
        const vlmd_chat_tool_call *c = &m->tool_calls[k];
        if ((st = marker(out, "\n<tool_call>\n{\"name\": \"")) == VLMD_OK &&
            (st = text(out, c->name, strlen(c->name))) == VLMD_OK &&
            (st = marker(out, "\", \"arguments\": ")) == VLMD_OK &&
            (st = text(out, c->arguments, strlen(c->arguments))) == VLMD_OK)
            st = marker(out, "}\n</tool_call>");
    }
    return st == VLMD_OK ? marker(out, "<|im_end|>\n") : st;
}

vlmd_status vlmd_chat_render_tools(const vlmd_chat_message *msgs, size_t n,
                                   const vlmd_prompt_text *tools_section,
                                   bool add_generation_prompt, vlmd_prompt_text *out,
                                   vlmd_error *err)
{
    vlmd_status st = VLMD_OK;
    bool leading_system = n > 0 && strcmp(msgs[0].role, "system") == 0;
    size_t first = 0;
    if (tools_section) { /* the system turn carries the tools */
        st = marker(out, "<|im_start|>system\n");
        if (st == VLMD_OK && leading_system)
            st = render_parts(&msgs[0], 0, out, err);
        else if (st == VLMD_OK)
            st = marker(out, VLMD_DEFAULT_SYSTEM_PROMPT);
        if (st == VLMD_OK && (st = vlmd_prompt_append(out, tools_section)) == VLMD_OK)
            st = marker(out, "<|im_end|>\n");
        first = leading_system ? 1 : 0;
    } else if (!leading_system) {
        st = marker(out, "<|im_start|>system\n" VLMD_DEFAULT_SYSTEM_PROMPT "<|im_end|>\n");
    }
    for (size_t i = first; i < n && st == VLMD_OK; i++) {
        const vlmd_chat_message *m = &msgs[i];
        if (!role_known(m->role))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "messages[%zu].role: '%s' is not "
                               "system, user, assistant or tool", i, m->role);
        if (m->n_tool_calls) {
            st = render_calls(m, i, out, err);
        } else if (strcmp(m->role, "tool") == 0) { /* consecutive results: one user turn */
            if (i == 0 || strcmp(msgs[i - 1].role, "tool") != 0)
                st = marker(out, "<|im_start|>user");
            if (st == VLMD_OK && (st = marker(out, "\n<tool_response>\n")) == VLMD_OK &&
                (st = render_parts(m, i, out, err)) == VLMD_OK)
                st = marker(out, "\n</tool_response>");
            if (st == VLMD_OK && (i + 1 == n || strcmp(msgs[i + 1].role, "tool") != 0))
                st = marker(out, "<|im_end|>\n");
        } else { /* the role is one of role_known's */
            if ((st = marker(out, "<|im_start|>")) == VLMD_OK &&
                (st = marker(out, m->role)) == VLMD_OK && (st = marker(out, "\n")) == VLMD_OK &&
                (st = render_parts(m, i, out, err)) == VLMD_OK)
                st = marker(out, "<|im_end|>\n");
        }
        if (st == VLMD_ERR_INVALID_ARG)
            return st; /* err names the part */
    }
    if (st == VLMD_OK && add_generation_prompt)
        st = marker(out, "<|im_start|>assistant\n");
    if (st == VLMD_ERR_INVALID_ARG)
        return st;
    return st == VLMD_OK ? VLMD_OK : vlmd_errorf(err, st, "out of memory rendering the prompt");
}

vlmd_status vlmd_chat_render(const vlmd_chat_message *msgs, size_t n, bool add_generation_prompt,
                             vlmd_prompt_text *out, vlmd_error *err)
{
    return vlmd_chat_render_tools(msgs, n, NULL, add_generation_prompt, out, err);
}
