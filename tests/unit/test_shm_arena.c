/* test_shm_arena.c - the embedding arena's file: created, every byte of it is
 * reserved (a sparse file's page that finds its filesystem full is a SIGBUS
 * in the visual worker, docs/SECURITY.md); created again, it keeps its inode
 * and its reservation; without room (here the file-size limit, ulimit -f,
 * the one a test can set alone: tests/e2e/arena_room.test.mjs makes a small
 * tmpfs) it is refused, never a SIGXFSZ, with the size needed, the room
 * found and the flags that fix it, and nothing is left behind. The runtime
 * directory's choice refuses the same way when no base has room. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime_dir.h"
#include "shm_arena.h"

#define MIB (1u << 20)

/* A path for an arena on /dev/shm (tmpfs on Linux), or /tmp without one. */
static void arena_path(char *out, size_t n, const char *name)
{
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(out, n, "%s/vlmd-test-arena-%s-%d", dir, name, (int)getpid());
    unlink(out);
}

static void limit_file_size(rlim_t bytes)
{
    struct rlimit rl = {bytes, bytes};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0, "%s", strerror(errno));
}

Test(shm_arena, creating_it_reserves_every_byte)
{
    char path[128];
    arena_path(path, sizeof path, "reserve");
    vlmd_error err = {0};
    cr_assert_eq(vlmd_shm_arena_create(path, 32 * MIB, &err), VLMD_OK, "%s", err.msg);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_expect_eq(sb.st_size, 32 * MIB);
    cr_expect_geq((unsigned long long)sb.st_blocks * 512, 32ull * MIB,
                  "the whole file is allocated, not sparse: %llu bytes of %u",
                  (unsigned long long)sb.st_blocks * 512, 32 * MIB);
    vlmd_shm_arena a;
    cr_assert_eq(vlmd_shm_arena_open(path, true, &a, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(a.size, 32 * MIB);
    memset(a.base, 0x5a, a.size); /* every page is there to write */
    vlmd_shm_arena_close(&a);
    unlink(path);
}

Test(shm_arena, created_again_it_keeps_its_inode_and_its_reservation)
{
    char path[128];
    arena_path(path, sizeof path, "again");
    vlmd_error err = {0};
    cr_assert_eq(vlmd_shm_arena_create(path, 4 * MIB, &err), VLMD_OK, "%s", err.msg);
    struct stat before, after;
    cr_assert_eq(stat(path, &before), 0);
    cr_assert_eq(vlmd_shm_arena_create(path, 4 * MIB, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(stat(path, &after), 0);
    cr_expect_eq(before.st_ino, after.st_ino, "a restarted router reuses the inode");
    cr_expect_geq((unsigned long long)after.st_blocks * 512, 4ull * MIB);
    unlink(path);
}

Test(shm_arena, past_the_file_size_limit_it_is_refused_with_the_numbers_and_the_flags)
{
    char path[128];
    arena_path(path, sizeof path, "limit");
    limit_file_size(8 * MIB); /* before the fix: ftruncate raised SIGXFSZ and this test died */
    vlmd_error err = {0};
    vlmd_status st = vlmd_shm_arena_create(path, 32 * MIB, &err);
    cr_assert_eq(st, VLMD_ERR_TOO_LARGE, "%s: %s", vlmd_status_str(st), err.msg);
    const char *const named[] = {path, "needs 32 MiB", "8 MiB", "ulimit -f", "--embed-arena-mb",
                                 "--runtime-dir", "--embed-arena-path"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        cr_expect(strstr(err.msg, named[i]), "names %s: %s", named[i], err.msg);
    cr_expect_neq(access(path, F_OK), 0, "the file it made is gone");

    vlmd_shm_room room = vlmd_shm_arena_room("/tmp");
    cr_expect_eq(room.bytes, 8 * MIB);
    cr_expect(room.file_limit);
    cr_assert_eq(vlmd_shm_arena_create(path, 8 * MIB, &err), VLMD_OK, "at the limit: %s", err.msg);
    unlink(path);
}

Test(shm_arena, a_runtime_directory_goes_where_the_arena_has_room_or_is_refused)
{
    limit_file_size(8 * MIB); /* every base: $XDG_RUNTIME_DIR, /dev/shm, /tmp */
    runtime_dir d;
    vlmd_error err = {0};
    vlmd_status st = runtime_dir_open(&d, "", 32 * MIB, &err);
    cr_assert_eq(st, VLMD_ERR_TOO_LARGE, "%s: %s", vlmd_status_str(st), err.msg);
    static const char *const named[] = {"needs 32 MiB", "/tmp: 8 MiB", "ulimit -f",
                                        "--embed-arena-mb", "--runtime-dir",
                                        "--embed-arena-path"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        cr_expect(strstr(err.msg, named[i]), "names %s: %s", named[i], err.msg);
    cr_expect_not(d.created);

    cr_assert_eq(runtime_dir_open(&d, "", 8 * MIB, &err), VLMD_OK, "room for it: %s", err.msg);
    cr_expect(d.created);
    runtime_dir_close(&d);
}
