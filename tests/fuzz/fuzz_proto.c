/* fuzz_proto.c - libFuzzer target: any bytes through the message decoder.
 * A decode either fails cleanly (nothing owned, the message zeroed) or gives
 * a message that encodes again and decodes to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vlmd_msg m;
    if (vlmd_msg_decode(data, size, &m, NULL) != VLMD_OK) {
        static const vlmd_msg zero;
        if (memcmp(&m, &zero, sizeof m) != 0)
            abort(); /* a failed decode must leave nothing behind */
        return 0;
    }
    vlmd_buf once = VLMD_BUF_INIT, twice = VLMD_BUF_INIT;
    vlmd_msg again;
    if (vlmd_msg_encode(&m, &once, NULL) != VLMD_OK ||
        vlmd_msg_decode(once.data, once.len, &again, NULL) != VLMD_OK ||
        vlmd_msg_encode(&again, &twice, NULL) != VLMD_OK || once.len != twice.len ||
        memcmp(once.data, twice.data, once.len) != 0)
        abort(); /* what decodes must encode, and round-trip to the same bytes */
    vlmd_msg_free(&again);
    vlmd_msg_free(&m);
    vlmd_buf_free(&once);
    vlmd_buf_free(&twice);
    return 0;
}
