/* chat_template.c - ChatML for the Qwen family (see chat_template.h). */
#include "chat_template.h"

#include <string.h>

static bool role_known(const char *role)
{
    return strcmp(role, "system") == 0 || strcmp(role, "user") == 0 ||
           strcmp(role, "assistant") == 0 || strcmp(role, "tool") == 0;
}

static vlmd_status render_parts(const vlmd_chat_message *m, size_t i, vlmd_buf *out,
                                vlmd_error *err)
{
    vlmd_status st = VLMD_OK;
    for (size_t k = 0; k < m->n_parts && st == VLMD_OK; k++) {
        if (m->parts[k].kind == VLMD_CHAT_TEXT)
            st = vlmd_buf_append(out, m->parts[k].text, m->parts[k].len);
        else if (strcmp(m->role, "user") == 0)
            st = vlmd_buf_puts(out, "<|vision_start|><|image_pad|><|vision_end|>");
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
static vlmd_status render_calls(const vlmd_chat_message *m, size_t i, vlmd_buf *out,
                                vlmd_error *err)
{
    vlmd_status st = vlmd_buf_puts(out, "<|im_start|>assistant");
    if (st == VLMD_OK && has_text(m) && (st = vlmd_buf_puts(out, "\n")) == VLMD_OK)
        st = render_parts(m, i, out, err);
    for (size_t k = 0; k < m->n_tool_calls && st == VLMD_OK; k++)
        st = vlmd_buf_printf(out, "\n<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n"
                             "</tool_call>", m->tool_calls[k].name, m->tool_calls[k].arguments);
    return st == VLMD_OK ? vlmd_buf_puts(out, "<|im_end|>\n") : st;
}

vlmd_status vlmd_chat_render_tools(const vlmd_chat_message *msgs, size_t n,
                                   const char *tools_section, bool add_generation_prompt,
                                   vlmd_buf *out, vlmd_error *err)
{
    vlmd_status st = VLMD_OK;
    bool leading_system = n > 0 && strcmp(msgs[0].role, "system") == 0;
    size_t first = 0;
    if (tools_section) { /* the system turn carries the tools */
        st = vlmd_buf_puts(out, "<|im_start|>system\n");
        if (st == VLMD_OK && leading_system)
            st = render_parts(&msgs[0], 0, out, err);
        else if (st == VLMD_OK)
            st = vlmd_buf_puts(out, VLMD_DEFAULT_SYSTEM_PROMPT);
        if (st == VLMD_OK && (st = vlmd_buf_puts(out, tools_section)) == VLMD_OK)
            st = vlmd_buf_puts(out, "<|im_end|>\n");
        first = leading_system ? 1 : 0;
    } else if (!leading_system) {
        st = vlmd_buf_puts(out, "<|im_start|>system\n" VLMD_DEFAULT_SYSTEM_PROMPT "<|im_end|>\n");
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
                st = vlmd_buf_puts(out, "<|im_start|>user");
            if (st == VLMD_OK && (st = vlmd_buf_puts(out, "\n<tool_response>\n")) == VLMD_OK &&
                (st = render_parts(m, i, out, err)) == VLMD_OK)
                st = vlmd_buf_puts(out, "\n</tool_response>");
            if (st == VLMD_OK && (i + 1 == n || strcmp(msgs[i + 1].role, "tool") != 0))
                st = vlmd_buf_puts(out, "<|im_end|>\n");
        } else {
            st = vlmd_buf_printf(out, "<|im_start|>%s\n", m->role);
            if (st == VLMD_OK && (st = render_parts(m, i, out, err)) == VLMD_OK)
                st = vlmd_buf_puts(out, "<|im_end|>\n");
        }
        if (st == VLMD_ERR_INVALID_ARG)
            return st; /* err names the part */
    }
    if (st == VLMD_OK && add_generation_prompt)
        st = vlmd_buf_puts(out, "<|im_start|>assistant\n");
    if (st == VLMD_ERR_INVALID_ARG)
        return st;
    return st == VLMD_OK ? VLMD_OK : vlmd_errorf(err, st, "out of memory rendering the prompt");
}

vlmd_status vlmd_chat_render(const vlmd_chat_message *msgs, size_t n, bool add_generation_prompt,
                             vlmd_buf *out, vlmd_error *err)
{
    return vlmd_chat_render_tools(msgs, n, NULL, add_generation_prompt, out, err);
}
