/* test_support.h - what several unit tests share. */
#ifndef VLMD_TEST_SUPPORT_H
#define VLMD_TEST_SUPPORT_H

#include <math.h>
#include <stddef.h>
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

/* ||got - want|| / ||want|| over n floats: how the tests compare with the
 * fixtures' references (their README's tolerances are of this kind). */
static inline double test_rel_error(const float *got, const float *want, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
    }
    return sqrt(diff / norm);
}

#endif
