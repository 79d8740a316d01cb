/* models.c - /v1/models and the served model's name. */
#include "models.h"

#include <string.h>

#include "buf.h"

json_t *vlmd_model_render(const char *name, int64_t created_unix_s, int64_t max_model_len)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", name, "object", "model", "created",
                     (json_int_t)created_unix_s, "owned_by", "vlmd", "max_model_len",
                     (json_int_t)max_model_len);
}

json_t *vlmd_models_render(const char *name, int64_t created_unix_s, int64_t max_model_len)
{
    return json_pack("{s:s, s:[o]}", "object", "list", "data",
                     vlmd_model_render(name, created_unix_s, max_model_len));
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

bool vlmd_model_id_decode(const char *s, size_t len, char *out, size_t outsz)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 2 < len ? hex_digit(s[i + 1]) : -1;
            int lo = hi >= 0 ? hex_digit(s[i + 2]) : -1;
            if (lo < 0)
                return false;
            c = hi * 16 + lo;
            i += 2;
        }
        if (c == 0 || n + 1 >= outsz)
            return false;
        out[n++] = (char)c;
    }
    out[n] = '\0';
    return true;
}
