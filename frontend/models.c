/* models.c - /v1/models and the served model's name. */
#include "models.h"

#include <string.h>

#include "buf.h"

json_t *vlmd_models_render(const char *name, int64_t created_unix_s, int64_t max_model_len)
{
    return json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list", "data", "id", name,
                     "object", "model", "created", (json_int_t)created_unix_s, "owned_by", "vlmd",
                     "max_model_len", (json_int_t)max_model_len);
}

void vlmd_served_model_name(const char *flag_value, const char *model_dir, char *out, size_t outsz)
{
    if (flag_value && flag_value[0]) {
        vlmd_strlcpy(out, flag_value, outsz);
        return;
    }
    size_t end = strlen(model_dir);
    while (end > 1 && model_dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && model_dir[start - 1] != '/')
        start--;
    size_t n = end - start;
    if (n == 0) { /* "/" itself */
        vlmd_strlcpy(out, model_dir, outsz);
        return;
    }
    if (n >= outsz)
        n = outsz - 1;
    memcpy(out, model_dir + start, n);
    out[n] = '\0';
}
