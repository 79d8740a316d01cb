/* shm_arena.c - the shared embedding arena's file, its reservation and its
 * mappings (see shm_arena.h). */
#include "shm_arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static uint64_t file_size_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return (uint64_t)rl.rlim_cur;
}

/* The room a file holding `held` bytes already has: its filesystem's free
 * space (when s is known and the filesystem has a size) plus what it holds,
 * within the file-size limit. */
static vlmd_shm_room room_of(const struct statvfs *s, uint64_t held)
{
    uint64_t fs = UINT64_MAX;
    if (s && s->f_blocks) { /* a tmpfs mounted without a size reports none */
        fs = (uint64_t)s->f_bavail * s->f_frsize;
        fs = fs > UINT64_MAX - held ? UINT64_MAX : fs + held;
    }
    uint64_t limit = file_size_limit();
    return limit < fs ? (vlmd_shm_room){limit, true} : (vlmd_shm_room){fs, false};
}

vlmd_shm_room vlmd_shm_arena_room(const char *dir)
{
    struct statvfs s;
    return room_of(statvfs(dir, &s) == 0 ? &s : NULL, 0);
}

const char *vlmd_shm_room_str(const vlmd_shm_room *r, char *out, size_t n)
{
    unsigned long long mib = (unsigned long long)(r->bytes >> 20);
    if (r->bytes == UINT64_MAX)
        snprintf(out, n, "no known bound");
    else if (r->file_limit)
        snprintf(out, n, "%llu MiB under the file-size limit (ulimit -f)", mib);
    else
        snprintf(out, n, "%llu MiB free", mib);
    return out;
}

/* The refusal: the size needed, the room found (why: the errno of a failed
 * reservation, 0 when it was not tried) and what to change. */
static vlmd_status no_room(vlmd_error *err, const char *path, size_t size,
                           const vlmd_shm_room *room, int why)
{
    char found[128] = "";
    if (room->bytes != UINT64_MAX)
        vlmd_shm_room_str(room, found, sizeof found);
    if (why)
        snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s%s",
                 found[0] ? " (" : "no room (", strerror(why), ")");
    return vlmd_errorf(err, VLMD_ERR_TOO_LARGE,
                       "the embedding arena %s needs %llu MiB (--embed-arena-mb) and finds %s; "
                       "give a smaller --embed-arena-mb, or put the arena where there is room: "
                       "--runtime-dir DIR or --embed-arena-path FILE (in Docker, a larger "
                       "--shm-size)",
                       path, (unsigned long long)(size >> 20), found);
}

vlmd_status vlmd_shm_arena_create(const char *path, size_t size, vlmd_error *err)
{
    bool made = true;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        made = false;
        fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (fd < 0)
        return vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: %s", path, strerror(errno));
    struct statvfs s;
    struct stat sb;
    vlmd_shm_room room = room_of(fstatvfs(fd, &s) == 0 ? &s : NULL,
                                 fstat(fd, &sb) == 0 ? (uint64_t)sb.st_blocks * 512 : 0);
    vlmd_status st = VLMD_OK;
    int rc;
    if (room.file_limit && size > room.bytes) {
        /* checked first: past the limit, ftruncate would raise SIGXFSZ */
        st = no_room(err, path, size, &room, 0);
    } else if (ftruncate(fd, (off_t)size) != 0) {
        /* ftruncate keeps the inode: processes that mapped it before keep a valid mapping */
        st = vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: cannot size it to %zu bytes: %s",
                         path, size, strerror(errno));
    } else if ((rc = posix_fallocate(fd, 0, (off_t)size)) != 0) {
        /* tmpfs gives back what a failed call took */
        if (rc == ENOSPC || rc == EFBIG || rc == EDQUOT || rc == ENOMEM)
            st = no_room(err, path, size, &room, rc);
        else
            st = vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: cannot reserve %zu bytes: %s",
                             path, size, strerror(rc));
    }
    close(fd);
    if (st != VLMD_OK && made)
        unlink(path);
    return st;
}

vlmd_status vlmd_shm_arena_open(const char *path, bool writable, vlmd_shm_arena *out,
                                vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return vlmd_errorf(err, errno == ENOENT ? VLMD_ERR_NOT_FOUND : VLMD_ERR_IO,
                           "embedding arena %s: %s", path, strerror(errno));
    struct stat sb;
    vlmd_status st = VLMD_OK;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0) {
        st = vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: empty or unreadable", path);
    } else {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | (writable ? PROT_WRITE : 0),
                       MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            st = vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: mmap: %s", path,
                             strerror(errno));
        else
            *out = (vlmd_shm_arena){p, (size_t)sb.st_size, writable};
    }
    close(fd);
    return st;
}

bool vlmd_shm_arena_holds(const vlmd_shm_arena *a, uint64_t offset, uint64_t bytes)
{
    return a->base && offset <= a->size && bytes <= a->size - offset;
}

void vlmd_shm_arena_close(vlmd_shm_arena *a)
{
    if (a->base)
        munmap(a->base, a->size);
    memset(a, 0, sizeof *a);
}
