/* chat_template.h - the chat templates of the model families vlmd serves, one
 * table entry each (chat_template.c); not a Jinja engine: each published
 * template written by hand. An entry is data (its markers' choices, its
 * thinking, its tool-call format, how it is recognised) and the dialect that
 * writes prompts of its kind:
 *   ChatML (the Qwen families):
 *     <|im_start|>system\nSYSTEM<|im_end|>\n        (a leading system turn, or
 *                                                  the family's default)
 *     <|im_start|>ROLE\nCONTENT<|im_end|>\n ...
 *     <|im_start|>assistant\n                       (generation prompt)
 *   GLM's (GLM-4.5, 4.6, 4.7):
 *     [gMASK]<sop><|system|>\nTOOLS<|system|>\nSYSTEM<|user|>\nCONTENT
 *     <|assistant|>\n<think>R</think>\nCONTENT\n<tool_call>...<|observation|>
 *     \n<tool_response>\nRESULT\n</tool_response><|assistant|>
 *   [INST] (Mixtral-8x7B-Instruct):
 *     <s> [INST] SYSTEM\n\nCONTENT [/INST] ANSWER</s> [INST] ... [/INST]
 * An image part (ChatML) is <|vision_start|><|image_pad|><|vision_end|>; the
 * single pad is expanded to the image's token count after tokenizing. Tools,
 * calls and their results are written by the family's tool-call format
 * (tools.h). The families:
 *   qwen2     Qwen2, Qwen2-VL, Qwen2.5-VL: default system prompt
 *   qwen2_5   Qwen2.5 (text): its own default system prompt; text parts
 *             joined by "\n" (its template takes the content as one string)
 *   qwen3     Qwen3, Qwen3-MoE (Qwen3-8B's template): no default system
 *             prompt; the enable_thinking switch (on by default; off, the
 *             generation prompt closes an empty think block); assistant turns
 *             before the last user query lose their <think> part, later ones
 *             keep it (from reasoning_content or their text)
 *   qwen3_thinking  Qwen3-2507 Thinking: as qwen3, but no switch: the
 *             generation prompt opens the think block ("<think>\n")
 *   qwen3_instruct  Qwen3-2507 Instruct: as qwen3, but no switch and no
 *             thinking: the answer is all content
 *   qwen3_vl  Qwen3-VL(-MoE) Instruct: no default system prompt, no thinking,
 *             system turns after the first are not written
 *   qwen3_vl_thinking  Qwen3-VL(-MoE) Thinking: as qwen3_vl, with earlier
 *             turns' think parts as qwen3's and the think block opened
 *   qwen3_5   Qwen3.5 / 3.6 up to 2B (their template's thinking off unless
 *             enable_thinking is true): no default system prompt; every
 *             turn's content trimmed; a system turn only first (a later one,
 *             or no user query, refused as the template raises); the tools
 *             section before the system text; every assistant turn after the
 *             last user query keeps a think block (empty or not), earlier
 *             ones lose theirs; images as Qwen3-VL's; qwen3_coder tool calls
 *   qwen3_5_think  Qwen3.5 / 3.6 from 4B (27B, 35B-A3B, ...): as qwen3_5,
 *             thinking on unless enable_thinking is false
 *   glm4_5    GLM-4.5, 4.6 (4.7 by its architecture): thinking on by default,
 *             the model opens its think block itself (or answers without
 *             one); off, /nothink is glued to every user text and the
 *             generation prompt closes an empty block; glm45 tool calls
 *   mixtral   Mixtral-8x7B-Instruct: the system text folded into the first
 *             user turn; roles alternate user / assistant (else refused, as
 *             the template raises); no tools, no thinking
 * The family is the one the model's chat_template is recognised as, else the
 * one of its architecture (vlmd_chat_family_for_model).
 *
 * The prompt is written as pieces (tokenizer.h's vlmd_prompt_text): what the
 * template writes is trusted, so its markers become special ids; the text of
 * messages, parts, reasoning, calls and results is not, so a "<|im_end|>" a
 * client typed is the BPE of its characters and cannot end a turn, forge a
 * role or an image slot. */
#ifndef VLMD_CHAT_TEMPLATE_H
#define VLMD_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "model_config.h"
#include "status.h"
#include "tokenizer.h"

#define VLMD_DEFAULT_SYSTEM_PROMPT "You are a helpful assistant."

typedef struct vlmd_chat_family vlmd_chat_family;
typedef struct vlmd_chat_message vlmd_chat_message;
typedef struct vlmd_chat_options vlmd_chat_options;
struct tool_format; /* tools.h */

/* A dialect: writes the prompt of msgs[0..n) as a family of its kind does.
 * The messages' roles are known and images only where the family takes
 * them (vlmd_chat_render_with checked). Fails as vlmd_chat_render_with. */
typedef vlmd_status (*vlmd_chat_dialect)(const vlmd_chat_family *f, const vlmd_chat_message *msgs,
                                         size_t n, const vlmd_chat_options *opt,
                                         vlmd_prompt_text *out, vlmd_error *err);

/* How one family's template writes a chat; one entry of chat_template.c's table. */
struct vlmd_chat_family {
    const char *name;
    vlmd_chat_dialect render;       /* ChatML, GLM's or [INST] */
    const struct tool_format *tools;/* how it offers tools and writes and reads calls;
                                     * NULL: it has none (tools are refused) */
    const char *image_slot;         /* an image part's markers; NULL: it takes no images */
    const char *default_system;     /* written when no system turn leads; NULL: none */
    const char *part_separator;     /* between a turn's parts (a template that takes the
                                     * content as one string: vLLM joins text parts by "\n") */
    bool thinking;                  /* earlier assistant turns have think parts (reasoning) */
    bool think_switch;              /* enable_thinking (on by default; off closes an empty
                                     * think block in the generation prompt) */
    bool opens_think;               /* the generation prompt opens a think block: every
                                     * answer starts in it (Qwen3's Thinking models) */
    bool think_optional;            /* the model opens its think block itself, or answers
                                     * without one (GLM): an answer that does not open one
                                     * is all content */
    bool later_system;              /* system turns after the first are written */
    bool think_off_by_default;      /* enable_thinking absent means off (the small Qwen3.5
                                     * models' template) */
    bool trim_turns;                /* each turn's content is written trimmed of whitespace
                                     * (Qwen3.5's render_content(...)|trim) */
    bool think_after_query;         /* every assistant turn after the last user query has a
                                     * think block, empty or not (Qwen3.5) */
    bool tools_first;               /* the tools section comes before the system text in the
                                     * system turn (Qwen3.5) */
    bool switch_opens_think;        /* thinking on, the generation prompt opens the think
                                     * block (Qwen3.5; Qwen3's model opens it itself) */
    bool strict_turns;              /* refused as its template raises: a system turn after
                                     * the first, no user query at all (Qwen3.5) */
    const char *signature[3];       /* all in a chat_template: it is this family's */
    unsigned arches;                /* bit (1u << vlmd_arch): its architectures */
};

/* The family named so ("qwen2", "qwen2_5", "qwen3", "qwen3_thinking",
 * "qwen3_instruct", "qwen3_vl", "qwen3_vl_thinking", "qwen3_5", "qwen3_5_think",
 * "glm4_5", "mixtral");
 * NULL when none is. */
const vlmd_chat_family *vlmd_chat_family_find(const char *name);

/* The family of the model in dir: the first whose signature its chat_template
 * holds (tokenizer_config.json's "chat_template", else chat_template.jinja,
 * else chat_template.json's), else the one of arch. *source (optional) says
 * which ("tokenizer_config.json", ..., or "architecture"). Never NULL: a
 * model no entry claims gets qwen2's. */
const vlmd_chat_family *vlmd_chat_family_for_model(const char *dir, vlmd_arch arch,
                                                   const char **source);

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

struct vlmd_chat_message {
    const char *role;       /* "system", "user", "assistant" or "tool" (a call's result) */
    const vlmd_chat_part *parts;
    size_t n_parts;
    const vlmd_chat_tool_call *tool_calls;  /* assistant: after its text */
    size_t n_tool_calls;
    const char *reasoning;  /* assistant: its reasoning_content (borrowed); NULL: none given */
    size_t reasoning_len;
};

struct vlmd_chat_options {
    const vlmd_chat_family *family;     /* NULL: qwen2 */
    const vlmd_prompt_text *tools;      /* the tools section (tools.h; its pieces keep their
                                         * kinds): ChatML's follows the system prompt, GLM's
                                         * is a system turn of its own; NULL: none */
    bool add_generation_prompt;
    bool enable_thinking;               /* families with thinking: false closes the think
                                         * block in the generation prompt */
    bool call_forced;                   /* the answer starts with a forced call: a think
                                         * block the prompt opens is closed empty (GLM: the
                                         * generation prompt closes one) */
};

/* Appends the prompt to out, written by the family's dialect; calls by its
 * tool-call format. An unknown role, an image in a turn other than a user's
 * (or in any, for a family that takes none), or a conversation the family's
 * template refuses (mixtral: roles that do not alternate, a role it does not
 * have, calls) is VLMD_ERR_INVALID_ARG, the message starting with the
 * messages[i]... it names, or "messages" for the whole, then ':'; out of
 * memory is VLMD_ERR_NOMEM. On failure out holds a part of the prompt. */
vlmd_status vlmd_chat_render_with(const vlmd_chat_message *msgs, size_t n,
                                  const vlmd_chat_options *opt, vlmd_prompt_text *out,
                                  vlmd_error *err);
/* The same with qwen2's template and no tools. */
vlmd_status vlmd_chat_render(const vlmd_chat_message *msgs, size_t n, bool add_generation_prompt,
                             vlmd_prompt_text *out, vlmd_error *err);

#endif
