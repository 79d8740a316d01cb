/* chat_template.h - ChatML as the Qwen family writes it:
 *   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n   (when no system turn leads)
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n ...
 *   <|im_start|>assistant\n                                        (generation prompt)
 * An image part is <|vision_start|><|image_pad|><|vision_end|>; the single pad
 * is expanded to the image's token count after tokenizing. Tools, calls and
 * their results are written as Qwen2.5's template writes them (tools.h).
 *
 * The prompt is written as pieces (tokenizer.h's vlmd_prompt_text): what the
 * template writes is trusted, so its markers become special ids; the text of
 * messages, parts, calls and results is not, so a "<|im_end|>" a client typed
 * is the BPE of its characters and cannot end a turn, forge a role or an
 * image slot. */
#ifndef VLMD_CHAT_TEMPLATE_H
#define VLMD_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "status.h"
#include "tokenizer.h"

#define VLMD_DEFAULT_SYSTEM_PROMPT "You are a helpful assistant."

typedef enum vlmd_chat_part_kind {
    VLMD_CHAT_TEXT,
    VLMD_CHAT_IMAGE,
} vlmd_chat_part_kind;

typedef struct vlmd_chat_part {
    vlmd_chat_part_kind kind;
    const char *text;       /* VLMD_CHAT_TEXT: borrowed */
    size_t len;             /* its bytes (a NUL among them is text: JSON's "\u0000") */
} vlmd_chat_part;

/* A call an assistant turn made (tools.h). */
typedef struct vlmd_chat_tool_call {
    const char *name;
    const char *arguments;  /* the arguments object as JSON text */
} vlmd_chat_tool_call;

typedef struct vlmd_chat_message {
    const char *role;       /* "system", "user", "assistant" or "tool" (a call's result) */
    const vlmd_chat_part *parts;
    size_t n_parts;
    const vlmd_chat_tool_call *tool_calls;  /* assistant: after its text */
    size_t n_tool_calls;
} vlmd_chat_message;

/* Appends the prompt to out. An unknown role, or an image in a system or
 * assistant turn, is VLMD_ERR_INVALID_ARG naming the message's index. */
vlmd_status vlmd_chat_render(const vlmd_chat_message *msgs, size_t n, bool add_generation_prompt,
                             vlmd_prompt_text *out, vlmd_error *err);
/* The same with the request's tools: tools_section (NULL: none; its pieces
 * keep their kinds) follows the system prompt; calls are written as
 * <tool_call> blocks, and consecutive tool results as one user turn of
 * <tool_response> blocks. */
vlmd_status vlmd_chat_render_tools(const vlmd_chat_message *msgs, size_t n,
                                   const vlmd_prompt_text *tools_section,
                                   bool add_generation_prompt, vlmd_prompt_text *out,
                                   vlmd_error *err);

#endif
