/* log.c - formats log lines and writes each with a single write(2), so lines
 * from several threads or processes sharing a pipe do not interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

vlmd_log_level vlmd_log_threshold = VLMD_LOG_INFO;
static char log_process_name[32] = "vlmd";

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR", "OFF  "};

void vlmd_log_init(const char *process_name, vlmd_log_level level)
{
    snprintf(log_process_name, sizeof log_process_name, "%s", process_name);
    vlmd_log_threshold = level;
}

vlmd_status vlmd_log_level_parse(const char *s, vlmd_log_level *out, vlmd_error *err)
{
    for (int i = 0; i <= VLMD_LOG_OFF; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (vlmd_log_level)i;
            return VLMD_OK;
        }
    }
    return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                       "log level '%s' is not one of debug, info, warn, error, off", s);
}

const char *vlmd_log_level_str(vlmd_log_level level)
{
    return (unsigned)level <= VLMD_LOG_OFF ? level_names[level] : "?";
}

void vlmd_log_write(vlmd_log_level level, uint64_t req_id, const char *file, int line,
                    const char *fmt, ...)
{
    char buf[2048];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    int k = snprintf(buf + n, sizeof buf - n, ".%03dZ %s %s[%d]", (int)(tv.tv_usec / 1000),
                     level_tags[level <= VLMD_LOG_OFF ? level : VLMD_LOG_ERROR],
                     log_process_name, (int)getpid());
    n += (size_t)k;
    if (req_id && n < sizeof buf)
        n += (size_t)snprintf(buf + n, sizeof buf - n, " req=%llu", (unsigned long long)req_id);
    if (level >= VLMD_LOG_ERROR && n < sizeof buf) {
        const char *base = strrchr(file, '/');
        n += (size_t)snprintf(buf + n, sizeof buf - n, " (%s:%d)", base ? base + 1 : file, line);
    }
    if (n < sizeof buf)
        n += (size_t)snprintf(buf + n, sizeof buf - n, ": ");
    if (n < sizeof buf) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof buf - n, fmt, ap);
        va_end(ap);
        if (m > 0)
            n += (size_t)m;
    }
    if (n > sizeof buf - 2)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w; /* nowhere to report a failed log write */
}

void vlmd_log_die(void)
{
    exit(1);
}
