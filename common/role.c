/* role.c - names of the vlmd processes. */
#include "role.h"

static const char *const role_names[VLMD_ROLE_COUNT] = {
    "launcher", "router", "frontend", "visual", "llm",
};
static const char *const process_names[VLMD_ROLE_COUNT] = {
    "vlmd", "vlmd-router", "vlmd-frontend", "vlmd-visual", "vlmd-llm",
};

const char *vlmd_role_str(vlmd_role role)
{
    return (unsigned)role < VLMD_ROLE_COUNT ? role_names[role] : "?";
}

const char *vlmd_role_process_name(vlmd_role role)
{
    return (unsigned)role < VLMD_ROLE_COUNT ? process_names[role] : "?";
}
