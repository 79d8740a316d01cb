/* test_support.h - what several unit tests share. */
#ifndef VLMD_TEST_SUPPORT_H
#define VLMD_TEST_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>

/* tests/fixtures/REL: under $VLMD_FIXTURES_DIR when set (a bundle run on
 * another machine), else in the source tree. Returns a static buffer. */
static inline const char *test_fixture(const char *rel)
{
    static char path[4096];
    const char *dir = getenv("VLMD_FIXTURES_DIR");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : VLMD_FIXTURES_DIR, rel);
    return path;
}

#endif
