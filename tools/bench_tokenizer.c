/* bench_tokenizer.c - `vlmd-bench-tokenizer TOKENIZER_JSON [MIB]`: encodes
 * MIB (default 1) of mixed text (English, code, CJK, emoji, numbers) and
 * decodes it back, printing MB/s. A benchmark, not a test: the target is
 * 1 MiB encoded in under a second on the 2-core CI machine. Then MIB of one
 * character repeated (spaces, then "="): one pre-token, merged from the rank
 * buckets (the default for long pieces) and from the heap of every pair, the
 * ratio of the two in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "tokenizer.h"

static const char *const samples[] = {
    "The quick brown fox jumps over the lazy dog, again and again. ",
    "int main(void) { for (int i = 0; i < 10; i++) printf(\"%d\\n\", i); }\n",
    "\xe4\xb8\xad\xe6\x96\x87\xe5\x88\x86\xe8\xaf\x8d\xe6\xb5\x8b\xe8\xaf\x95\xef\xbc\x8c"
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82",
    " emoji \xf0\x9f\x98\x80\xf0\x9f\x9a\x80 and numbers 3.14159 2026 1e-9   \n\n",
    "<|im_start|>user\nDescribe the picture.<|im_end|>\n",
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: vlmd-bench-tokenizer TOKENIZER_JSON [MIB]\n");
        return 2;
    }
    double mib = argc > 2 ? atof(argv[2]) : 1.0;
    size_t target = (size_t)(mib * 1024 * 1024);
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    if (vlmd_tokenizer_load(argv[1], &tok, &err) != VLMD_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    vlmd_buf text = VLMD_BUF_INIT;
    for (size_t i = 0; text.len < target; i++)
        vlmd_buf_puts(&text, samples[i % (sizeof samples / sizeof samples[0])]);
    vlmd_tokens ids = {0};
    uint64_t t0 = vlmd_now_ns();
    vlmd_tokenizer_encode(tok, text.data, text.len, VLMD_SPECIAL_MATCH, &ids);
    uint64_t t1 = vlmd_now_ns();
    vlmd_buf out = VLMD_BUF_INIT;
    vlmd_tokenizer_decode(tok, ids.ids, ids.n, false, &out, NULL);
    uint64_t t2 = vlmd_now_ns();
    double enc = (double)(t1 - t0) / 1e9, dec = (double)(t2 - t1) / 1e9;
    printf("%.2f MiB, %zu tokens: encode %.3f s (%.1f MiB/s), decode %.3f s (%.1f MiB/s), "
           "round trip %s\n",
           (double)text.len / 1048576.0, ids.n, enc, (double)text.len / 1048576.0 / enc, dec,
           (double)text.len / 1048576.0 / dec,
           out.len == text.len && memcmp(out.data, text.data, text.len) == 0 ? "exact" : "DIFFERS");
    vlmd_buf_free(&out);
    vlmd_buf_free(&text);
    vlmd_tokens_free(&ids);
    const char runs[] = " =";
    char *run = malloc(target);
    for (int r = 0; run && r < 2; r++) {
        memset(run, runs[r], target);
        double secs[2];
        size_t n[2];
        for (int way = 0; way < 2; way++) { /* buckets, then the heap */
            vlmd_tokenizer_set_long_piece(tok, way ? SIZE_MAX : VLMD_TOKENIZER_LONG_PIECE);
            vlmd_tokens run_ids = {0};
            uint64_t r0 = vlmd_now_ns();
            vlmd_tokenizer_encode(tok, run, target, VLMD_SPECIAL_SPLIT, &run_ids);
            secs[way] = (double)(vlmd_now_ns() - r0) / 1e9;
            n[way] = run_ids.n;
            vlmd_tokens_free(&run_ids);
        }
        printf("%.2f MiB of '%c', %zu tokens: rank buckets %.3f s, heap %.3f s (%.1fx)%s\n",
               (double)target / 1048576.0, runs[r], n[0], secs[0], secs[1], secs[1] / secs[0],
               n[0] == n[1] ? "" : ", the two DIFFER");
    }
    free(run);
    vlmd_tokenizer_free(tok);
    return 0;
}
