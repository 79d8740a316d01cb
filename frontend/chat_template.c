/* chat_template.c - ChatML for the Qwen family (see chat_template.h). */
#include "chat_template.h"

#include <string.h>

static bool role_known(const char *role)
{
    return strcmp(role, "system") == 0 || strcmp(role, "user") == 0 ||
           strcmp(role, "assistant") == 0;
}

vlmd_status vlmd_chat_render(const vlmd_chat_message *msgs, size_t n, bool add_generation_prompt,
                             vlmd_buf *out, vlmd_error *err)
{
    vlmd_status st = VLMD_OK;
    if (n == 0 || strcmp(msgs[0].role, "system") != 0)
        st = vlmd_buf_puts(out, "<|im_start|>system\n" VLMD_DEFAULT_SYSTEM_PROMPT "<|im_end|>\n");
    for (size_t i = 0; i < n && st == VLMD_OK; i++) {
        const vlmd_chat_message *m = &msgs[i];
        if (!role_known(m->role))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                               "messages[%zu].role: '%s' is not system, user or assistant", i,
                               m->role);
        st = vlmd_buf_printf(out, "<|im_start|>%s\n", m->role);
        for (size_t k = 0; k < m->n_parts && st == VLMD_OK; k++) {
            if (m->parts[k].kind == VLMD_CHAT_TEXT) {
                st = vlmd_buf_append(out, m->parts[k].text, m->parts[k].len);
            } else if (strcmp(m->role, "user") == 0) {
                st = vlmd_buf_puts(out, "<|vision_start|><|image_pad|><|vision_end|>");
            } else {
                return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                                   "messages[%zu].content[%zu]: images are only allowed in user "
                                   "messages", i, k);
            }
        }
        if (st == VLMD_OK)
            st = vlmd_buf_puts(out, "<|im_end|>\n");
    }
    if (st == VLMD_OK && add_generation_prompt)
        st = vlmd_buf_puts(out, "<|im_start|>assistant\n");
    return st == VLMD_OK ? VLMD_OK : vlmd_errorf(err, st, "out of memory rendering the prompt");
}
