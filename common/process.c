/* process.c - ties a child's lifetime to the launcher's. */
#include "process.h"

#include <signal.h>
#include <stdlib.h>
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
