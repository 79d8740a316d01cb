/* shm_arena.c - the shared embedding arena's file and mappings (see shm_arena.h). */
#include "shm_arena.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

vlmd_status vlmd_shm_arena_create(const char *path, size_t size, vlmd_error *err)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: %s", path, strerror(errno));
    vlmd_status st = VLMD_OK;
    /* ftruncate keeps the inode: processes that mapped it before keep a valid mapping */
    if (ftruncate(fd, (off_t)size) != 0)
        st = vlmd_errorf(err, VLMD_ERR_IO, "embedding arena %s: cannot size it to %zu bytes: %s",
                         path, size, strerror(errno));
    close(fd);
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
