/* log.h - leveled logging to stderr.
 *
 * Every line: "2026-11-22T11:49:19.123Z INFO  vlmd-router[1234] req=17: text".
 * The level is checked before the arguments are evaluated, so a disabled
 * VLMD_DEBUG costs one comparison. The logger is the one process-wide state
 * outside the context struct: it is set once in main() before any thread
 * starts and only read afterwards. */
#ifndef VLMD_LOG_H
#define VLMD_LOG_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vlmd_log_level {
    VLMD_LOG_DEBUG = 0,
    VLMD_LOG_INFO,
    VLMD_LOG_WARN,
    VLMD_LOG_ERROR,
    VLMD_LOG_OFF
} vlmd_log_level;

extern vlmd_log_level vlmd_log_threshold;

/* Sets the process name shown on every line and the threshold. */
void vlmd_log_init(const char *process_name, vlmd_log_level level);
/* Parses "debug", "info", "warn", "error", "off". */
vlmd_status vlmd_log_level_parse(const char *s, vlmd_log_level *out, vlmd_error *err);
const char *vlmd_log_level_str(vlmd_log_level level);

/* req_id 0 means "no request". */
void vlmd_log_write(vlmd_log_level level, uint64_t req_id, const char *file, int line,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define VLMD_LOG_AT(level, req, ...)                                                \
    do {                                                                            \
        if ((level) >= vlmd_log_threshold)                                          \
            vlmd_log_write((level), (req), __FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

#define VLMD_DEBUG(...) VLMD_LOG_AT(VLMD_LOG_DEBUG, 0, __VA_ARGS__)
#define VLMD_INFO(...) VLMD_LOG_AT(VLMD_LOG_INFO, 0, __VA_ARGS__)
#define VLMD_WARN(...) VLMD_LOG_AT(VLMD_LOG_WARN, 0, __VA_ARGS__)
#define VLMD_ERROR(...) VLMD_LOG_AT(VLMD_LOG_ERROR, 0, __VA_ARGS__)
#define VLMD_REQ_DEBUG(req, ...) VLMD_LOG_AT(VLMD_LOG_DEBUG, (req), __VA_ARGS__)
#define VLMD_REQ_INFO(req, ...) VLMD_LOG_AT(VLMD_LOG_INFO, (req), __VA_ARGS__)
#define VLMD_REQ_WARN(req, ...) VLMD_LOG_AT(VLMD_LOG_WARN, (req), __VA_ARGS__)

/* Fatal: start-up errors and broken invariants. Logs with file:line, exits 1. */
#define VLMD_FATAL(...)                                                             \
    do {                                                                            \
        vlmd_log_write(VLMD_LOG_ERROR, 0, __FILE__, __LINE__, __VA_ARGS__);         \
        vlmd_log_die();                                                             \
    } while (0)

/* Checks an invariant in every build type. */
#define VLMD_ASSERT(cond)                                                           \
    do {                                                                            \
        if (!(cond))                                                                \
            VLMD_FATAL("assertion failed: %s", #cond);                              \
    } while (0)

__attribute__((noreturn)) void vlmd_log_die(void);

#ifdef __cplusplus
}
#endif

#endif
