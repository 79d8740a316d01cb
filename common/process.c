/* process.c - ties a child's lifetime to the launcher's; reads a child's CPU
 * time (see process.h). */
#include "process.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "buf.h"
#include "log.h"

void vlmd_process_ignore_sigpipe(void)
{
    signal(SIGPIPE, SIG_IGN);
}

void vlmd_process_follow_launcher(void)
{
    const char *s = getenv("VLMD_LAUNCHER_PID");
    long long pid;
    if (!s || vlmd_parse_i64(s, 1, 1LL << 31, &pid) != VLMD_OK)
        return;
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0)
        VLMD_WARN("cannot ask to follow the launcher (prctl): this process may outlive it");
    /* The launcher may have died before prctl took effect. */
    if (getppid() != (pid_t)pid)
        VLMD_FATAL("the launcher (pid %lld) is gone; exiting", pid);
}

int64_t vlmd_process_loop_cpu_ms(int64_t pid)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%lld/task/%lld/stat", (long long)pid, (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = '\0';
    /* pid (comm) state ppid ...: the name may hold spaces and parentheses, so
     * the fields are counted from its last ')'; utime and stime are 14th and 15th */
    const char *p = strrchr(line, ')');
    unsigned long long utime, stime;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                     &stime) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return (int64_t)((utime + stime) * 1000 / (unsigned long long)(hz > 0 ? hz : 100));
}
