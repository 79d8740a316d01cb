/* sse.h - an incremental reader of Server-Sent Events (the WHATWG rules vlmd
 * and OpenAI's API follow): bytes arrive in any pieces; each event's data
 * lines, joined by "\n", are handed over at the blank line that ends it.
 * Comments (":") and other fields are skipped. */
#ifndef VLMD_BENCH_SSE_H
#define VLMD_BENCH_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

typedef void (*sse_event_fn)(const char *data, size_t len, void *ud);

typedef struct sse_reader {
    vlmd_buf line;              /* the line being read */
    vlmd_buf data;              /* the event's data so far */
    bool has_data;
    bool after_cr;              /* a "\r" ended the last line: a "\n" next is part of it */
} sse_reader;

/* Reads n bytes; calls fn for every event they complete. False when out of memory. */
bool sse_feed(sse_reader *r, const char *bytes, size_t n, sse_event_fn fn, void *ud);
void sse_reader_free(sse_reader *r);

#endif
