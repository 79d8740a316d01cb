/* fuzz_tokenizer.c - libFuzzer target: any bytes as text through the BPE
 * encoder (whole, with special tokens matched or split, and as a prompt whose
 * pieces change kind at each newline), and the ids it gives (and arbitrary
 * ids) through the streaming detokenizer, which must never emit a broken
 * UTF-8 sequence. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static vlmd_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (vlmd_tokenizer_load(VLMD_FIXTURES_DIR "/qwen2/tokenizer.json", &tok, NULL) != VLMD_OK)
        abort();
    return 0;
}

/* True when s[0..n) is valid UTF-8. */
static bool utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n)
            return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        i += k;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vlmd_tokens ids = {0};
    vlmd_special kind = size & 1 ? VLMD_SPECIAL_MATCH : VLMD_SPECIAL_SPLIT;
    if (vlmd_tokenizer_encode(tok, (const char *)data, size, kind, &ids) != VLMD_OK)
        abort();
    vlmd_prompt_text prompt = VLMD_PROMPT_TEXT_INIT;
    for (size_t i = 0, start = 0; i < size; i++)
        if (data[i] == '\n' || i + 1 == size) {
            const char *piece = (const char *)data + start;
            if (vlmd_prompt_add(&prompt, kind, piece, i + 1 - start) != VLMD_OK)
                abort();
            kind = kind == VLMD_SPECIAL_MATCH ? VLMD_SPECIAL_SPLIT : VLMD_SPECIAL_MATCH;
            start = i + 1;
        }
    if (vlmd_tokenizer_encode_prompt(tok, &prompt, &ids) != VLMD_OK)
        abort();
    vlmd_prompt_free(&prompt);
    /* the input's ids, then ids read from its bytes */
    for (size_t i = 0; i + 1 < size; i += 2)
        vlmd_tokens_push(&ids, (uint32_t)(data[i] | data[i + 1] << 8) % vlmd_tokenizer_size(tok));
    vlmd_detok d = {.skip_special = size & 2};
    vlmd_buf text = VLMD_BUF_INIT;
    for (size_t i = 0; i < ids.n; i++)
        vlmd_detok_push(&d, tok, ids.ids[i], &text, NULL);
    if (!utf8_valid((const uint8_t *)text.data, text.len))
        abort(); /* whole characters only, until the flush */
    vlmd_detok_flush(&d, tok, &text);
    vlmd_buf_free(&text);
    vlmd_tokens_free(&ids);
    return 0;
}
