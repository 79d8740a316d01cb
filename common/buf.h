/* buf.h - safe string and byte-buffer helpers.
 *
 * vlmd_buf is a growable byte buffer that always stays NUL-terminated, so it
 * doubles as a string builder. Functions that can fail return a vlmd_status;
 * on failure the buffer keeps its earlier contents. */
#ifndef VLMD_BUF_H
#define VLMD_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "status.h"

typedef struct vlmd_buf {
    char *data;     /* owned; NUL-terminated when not NULL */
    size_t len;     /* bytes used, not counting the NUL */
    size_t cap;     /* bytes allocated */
} vlmd_buf;

#define VLMD_BUF_INIT {NULL, 0, 0}

vlmd_status vlmd_buf_reserve(vlmd_buf *b, size_t extra);
vlmd_status vlmd_buf_append(vlmd_buf *b, const void *data, size_t len);
vlmd_status vlmd_buf_puts(vlmd_buf *b, const char *s);
vlmd_status vlmd_buf_printf(vlmd_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
vlmd_status vlmd_buf_vprintf(vlmd_buf *b, const char *fmt, va_list ap);
void vlmd_buf_clear(vlmd_buf *b);       /* keeps the allocation */
void vlmd_buf_free(vlmd_buf *b);        /* accepts an empty buffer */

/* Room for element n of a realloc'd array of *cap elements of elem bytes:
 * items itself while n < *cap, else the array moved to twice the capacity
 * (first_cap at first) with *cap updated. NULL when out of memory (items
 * and *cap unchanged, still the caller's). */
void *vlmd_grow(void *items, size_t n, size_t *cap, size_t elem, size_t first_cap);

/* Copies src into dst of size dstsz, always NUL-terminating (dstsz > 0).
 * Returns the length of src, so a result >= dstsz means it was truncated. */
size_t vlmd_strlcpy(char *dst, const char *src, size_t dstsz);
/* The longest tail of text[0..len) that is a proper prefix of word: text
 * that may still become word as more arrives (0: none; word non-empty). */
size_t vlmd_partial_suffix(const char *text, size_t len, const char *word);
/* strdup that aborts the process on allocation failure (start-up paths only). */
char *vlmd_xstrdup(const char *s);
/* snprintf into a fresh heap string; NULL on allocation failure. */
char *vlmd_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parses a whole decimal integer in [min, max]; no trailing garbage. */
vlmd_status vlmd_parse_i64(const char *s, long long min, long long max, long long *out);
/* Parses a whole finite double in [min, max]. */
vlmd_status vlmd_parse_double(const char *s, double min, double max, double *out);
/* Reads a whole file (up to max_bytes) into *out; the caller frees it. */
vlmd_status vlmd_read_file(const char *path, size_t max_bytes, vlmd_buf *out, vlmd_error *err);

#endif
