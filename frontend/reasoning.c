/* reasoning.c - reasoning and content of a thinking model's answer (see
 * reasoning.h). Text only: <think> and </think> are added tokens the
 * detokenizer writes out like any text (Qwen3's are not special; GLM's are,
 * and completions.c keeps them). */
#include "reasoning.h"

#include <string.h>

#include "buf.h"

bool reasoning_end(const char *text, size_t len, size_t from, size_t *at)
{
    const size_t close = strlen(REASONING_CLOSE);
    from = from >= close ? from - close + 1 : 0;
    const char *p = from < len ? memmem(text + from, len - from, REASONING_CLOSE, close) : NULL;
    if (p)
        *at = (size_t)(p - text);
    return p != NULL;
}

/* Whitespace an answer may begin with before its <think> (GLM writes "\n"). */
static size_t leading_space(const char *text, size_t len)
{
    size_t i = 0;
    while (i < len && (text[i] == '\n' || text[i] == ' ' || text[i] == '\t' || text[i] == '\r'))
        i++;
    return i;
}

reasoning_open reasoning_opens(const char *text, size_t len, bool final)
{
    const size_t open = strlen(REASONING_OPEN), w = leading_space(text, len);
    size_t have = len - w < open ? len - w : open;
    if (memcmp(text + w, REASONING_OPEN, have) != 0)
        return REASONING_NOT;
    if (have == open)
        return REASONING_OPENS;
    return final ? REASONING_NOT : REASONING_UNDECIDED;
}

void reasoning_shown(const char *text, size_t len, bool final, size_t *start, size_t *end)
{
    reasoning_open o = reasoning_opens(text, len, final);
    *start = o == REASONING_OPENS ? leading_space(text, len) + strlen(REASONING_OPEN) : 0;
    *end = len;
    if (o == REASONING_UNDECIDED) {
        *end = 0; /* may still be the <think> that is not shown */
        return;
    }
    if (final)
        return;
    *end = len - vlmd_partial_suffix(text, len, REASONING_CLOSE);
    if (*end < *start)
        *end = *start;
}
