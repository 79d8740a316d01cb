/* reasoning.h - a thinking model's answer split into its reasoning and its
 * content, as vLLM's qwen3 and glm45 reasoning parsers split it: the text
 * before the first </think> is reasoning (a <think> the answer opens with,
 * after any whitespace, is not part of it, nor is that whitespace; Qwen3's
 * template may also have opened the block in the prompt, and the answer then
 * has only </think>), the rest is content. An answer that ends before
 * </think> (max_tokens) is all reasoning. Where the model may answer without
 * thinking (GLM: its prompt leaves the block to the model), an answer that
 * does not open with <think> is all content (reasoning_opens). Used only
 * when the request thinks (api_request.h's reasoning): with thinking off, or
 * a template without it, the whole answer is content. */
#ifndef VLMD_REASONING_H
#define VLMD_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#define REASONING_OPEN "<think>"
#define REASONING_CLOSE "</think>"

/* Where the reasoning ends in text[0..len): true with *at on the first
 * </think> (the content starts at *at + strlen(REASONING_CLOSE)). Text
 * before `from` was searched already (a </think> may still end after it). */
bool reasoning_end(const char *text, size_t len, size_t from, size_t *at);

/* The reasoning text[0..len) may show, as [*start, *end): past a leading
 * <think> (and the whitespace before it), and (not final) short of a tail
 * that could still become </think>, or of a start that could still become
 * <think>. For text before any </think> (reasoning_end false, or cut
 * there). */
void reasoning_shown(const char *text, size_t len, bool final, size_t *start, size_t *end);

/* Whether an answer text[0..len) opens a think block: whitespace, then
 * <think>. Undecided while it is whitespace and a start of <think> (final:
 * never). */
typedef enum reasoning_open {
    REASONING_OPENS,
    REASONING_NOT,
    REASONING_UNDECIDED,
} reasoning_open;
reasoning_open reasoning_opens(const char *text, size_t len, bool final);

#endif
