/* process.h - start-up chores every vlmd child process shares, and what the
 * launcher reads of a child. */
#ifndef VLMD_PROCESS_H
#define VLMD_PROCESS_H

#include <stdint.h>

/* Exit codes shared by every process. The launcher does not restart a worker
 * that exits with VLMD_EXIT_CONFIG: a bad flag or model stays bad. */
#define VLMD_EXIT_FATAL 1
#define VLMD_EXIT_CONFIG 2

/* Ignores SIGPIPE: a write to a socket whose peer left (a client that went
 * away mid-stream) must be an error on that socket, not the end of the
 * process. Every vlmd process calls it first. */
void vlmd_process_ignore_sigpipe(void);

/* When started by the launcher (VLMD_LAUNCHER_PID is set), asks the kernel to
 * send SIGTERM when the launcher dies, so a killed launcher leaves no orphans;
 * exits at once if the launcher is already gone. No-op otherwise (systemd). */
void vlmd_process_follow_launcher(void);

/* CPU time, user and system, that the main thread of process pid has used,
 * in milliseconds: the thread of a vlmd process's loop, which sends its
 * heartbeats. A process that stops sending them while this grows is busy; one
 * whose count stands still is hung (blocked, stopped, deadlocked). -1 when it
 * cannot be read (the process is gone). */
int64_t vlmd_process_loop_cpu_ms(int64_t pid);

#endif
