/* role.h - the processes of vlmd and their names.
 * Defines: vlmd_role, VLMD_ROLE_BIT(), vlmd_role_str(), vlmd_role_process_name(). */
#ifndef VLMD_ROLE_H
#define VLMD_ROLE_H

/* Wire values: append-only (they travel in proto messages). */
typedef enum vlmd_role {
    VLMD_ROLE_LAUNCHER = 0,
    VLMD_ROLE_ROUTER = 1,
    VLMD_ROLE_FRONTEND = 2,
    VLMD_ROLE_VISUAL = 3,
    VLMD_ROLE_LLM = 4,
    VLMD_ROLE_COUNT
} vlmd_role;

#define VLMD_ROLE_BIT(r) (1u << (r))
#define VLMD_ROLES_ALL ((1u << VLMD_ROLE_COUNT) - 1)
#define VLMD_ROLES_WORKERS                                                          \
    (VLMD_ROLE_BIT(VLMD_ROLE_ROUTER) | VLMD_ROLE_BIT(VLMD_ROLE_FRONTEND) |           \
     VLMD_ROLE_BIT(VLMD_ROLE_VISUAL) | VLMD_ROLE_BIT(VLMD_ROLE_LLM))

/* "launcher", "router", "frontend", "visual", "llm"; "?" when out of range. */
const char *vlmd_role_str(vlmd_role role);
/* Executable name: "vlmd", "vlmd-router", "vlmd-frontend", "vlmd-visual", "vlmd-llm". */
const char *vlmd_role_process_name(vlmd_role role);

#endif
