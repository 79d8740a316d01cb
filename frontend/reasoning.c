/* reasoning.c - reasoning and content of a thinking model's answer (see
 * reasoning.h). Text only: <think> and </think> are Qwen3's added tokens that
 * are not special, so the detokenizer writes them out like any text. */
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

void reasoning_shown(const char *text, size_t len, bool final, size_t *start, size_t *end)
{
    const size_t open = strlen(REASONING_OPEN);
    *start = len >= open && memcmp(text, REASONING_OPEN, open) == 0 ? open : 0;
    *end = len;
    if (final)
        return;
    if (len < open && memcmp(text, REASONING_OPEN, len) == 0) {
        *end = 0; /* may still be the <think> that is not shown */
        return;
    }
    *end = len - vlmd_partial_suffix(text, len, REASONING_CLOSE);
    if (*end < *start)
        *end = *start;
}
