/* runtime_dir.c - creating, marking and cleaning the launcher's runtime
 * directory (what and why in runtime_dir.h). */
#include "runtime_dir.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "log.h"
#include "shm_arena.h"

/* A process's start time in clock ticks since boot (field 22 of
 * /proc/PID/stat), or 0 when it cannot be read. */
static unsigned long long start_ticks(long long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ticks = 0;
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (p && sscanf(p + 1, "%llu", &ticks) != 1)
        ticks = 0;
    return ticks;
}

/* Whether the launcher an owner file names may still run. A file that
 * cannot be read counts as alive: nothing is removed on a guess. */
static bool owner_alive(const char *owner_file)
{
    FILE *f = fopen(owner_file, "r");
    if (!f)
        return true;
    long long pid = 0;
    unsigned long long ticks = 0;
    int got = fscanf(f, "%lld %llu", &pid, &ticks);
    fclose(f);
    if (got != 2 || pid <= 0)
        return true;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return false;
    return start_ticks(pid) == ticks; /* else the pid was reused */
}

int runtime_dir_remove_stale(const char *base)
{
    DIR *dir = opendir(base);
    if (!dir)
        return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        char path[PATH_MAX], file[PATH_MAX + 32];
        struct stat st;
        if (strncmp(de->d_name, "vlmd-", 5) != 0 ||
            snprintf(path, sizeof path, "%s/%s", base, de->d_name) >= (int)sizeof path ||
            lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
            continue;
        snprintf(file, sizeof file, "%s/%s", path, RUNTIME_DIR_OWNER_FILE);
        if (owner_alive(file))
            continue;
        static const char *const files[] = {RUNTIME_DIR_SOCKET_FILE, RUNTIME_DIR_ARENA_FILE,
                                            RUNTIME_DIR_OWNER_FILE};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            snprintf(file, sizeof file, "%s/%s", path, files[i]);
            unlink(file);
        }
        if (rmdir(path) == 0) {
            VLMD_INFO("removed %s, left behind by a launcher that is gone", path);
            removed++;
        } else {
            VLMD_WARN("cannot remove %s, left behind by a launcher that is gone: %s", path,
                      strerror(errno));
        }
    }
    closedir(dir);
    return removed;
}

static vlmd_status write_owner(const runtime_dir *d, vlmd_error *err)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", d->path, RUNTIME_DIR_OWNER_FILE);
    FILE *f = fopen(path, "w");
    long long pid = (long long)getpid();
    bool ok = f && fprintf(f, "%lld %llu\n", pid, start_ticks(pid)) > 0;
    if (f && fclose(f) != 0)
        ok = false;
    return ok ? VLMD_OK
              : vlmd_errorf(err, VLMD_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}

/* The base of a new runtime directory: the first writable of
 * $XDG_RUNTIME_DIR, /dev/shm and /tmp (memory-backed first: the embedding
 * arena is a file in it) with room for need bytes; what dead launchers left
 * there is removed first (a reserved arena takes room). NULL when none has
 * room, with err naming each and its room. */
static const char *choose_base(uint64_t need, vlmd_error *err)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    const char *const bases[] = {xdg && *xdg ? xdg : NULL, "/dev/shm", "/tmp"};
    char passed[512] = "";
    const char *base = NULL;
    for (size_t i = 0; i < sizeof bases / sizeof bases[0] && !base; i++) {
        if (!bases[i] || access(bases[i], W_OK) != 0)
            continue;
        runtime_dir_remove_stale(bases[i]);
        vlmd_shm_room room = vlmd_shm_arena_room(bases[i]);
        if (room.bytes >= need) {
            base = bases[i];
            continue;
        }
        char found[96];
        size_t at = strlen(passed);
        snprintf(passed + at, sizeof passed - at, "%s%s: %s", at ? ", " : "", bases[i],
                 vlmd_shm_room_str(&room, found, sizeof found));
    }
    if (!base && passed[0]) {
        vlmd_errorf(err, VLMD_ERR_TOO_LARGE,
                    "the embedding arena needs %llu MiB (--embed-arena-mb) and no runtime "
                    "directory has room for it (%s); give a smaller --embed-arena-mb, or a "
                    "directory with room: --runtime-dir DIR or --embed-arena-path FILE (in "
                    "Docker, a larger --shm-size)", (unsigned long long)(need >> 20), passed);
        return NULL;
    }
    if (passed[0])
        VLMD_WARN("%s: less than the embedding arena's %llu MiB (--embed-arena-mb); the runtime "
                  "directory goes under %s (a larger --shm-size in Docker, or --runtime-dir, keeps "
                  "it in memory)", passed, (unsigned long long)(need >> 20), base);
    return base ? base : "/tmp"; /* none writable: mkdtemp names the failure */
}

vlmd_status runtime_dir_open(runtime_dir *d, const char *given, uint64_t need, vlmd_error *err)
{
    memset(d, 0, sizeof *d);
    if (given[0]) {
        if (vlmd_strlcpy(d->path, given, sizeof d->path) >= sizeof d->path)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--runtime-dir is too long");
        if (mkdir(d->path, 0700) != 0 && errno != EEXIST)
            return vlmd_errorf(err, VLMD_ERR_IO, "--runtime-dir %s: %s", d->path,
                               strerror(errno));
        return VLMD_OK; /* the arena's own reservation says when it has no room */
    }
    const char *base = choose_base(need, err);
    if (!base)
        return VLMD_ERR_TOO_LARGE;
    snprintf(d->path, sizeof d->path, "%s/vlmd-XXXXXX", base);
    if (!mkdtemp(d->path))
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot create a runtime directory under %s: %s",
                           base, strerror(errno));
    d->created = true;
    vlmd_status st = write_owner(d, err);
    if (st != VLMD_OK)
        runtime_dir_close(d);
    return st;
}

void runtime_dir_close(runtime_dir *d)
{
    if (!d->created)
        return;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", d->path, RUNTIME_DIR_OWNER_FILE);
    if (unlink(path) != 0 && errno != ENOENT)
        VLMD_WARN("cannot remove %s: %s", path, strerror(errno));
    if (rmdir(d->path) != 0)
        VLMD_WARN("cannot remove %s: %s", d->path, strerror(errno));
    d->created = false;
}
