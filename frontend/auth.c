/* auth.c - API keys, as digests compared in constant time (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "log.h"

static void digest(const void *p, size_t n, uint8_t out[32])
{
    unsigned int len = 0;
    if (!EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) || len != 32)
        VLMD_FATAL("SHA-256 is not available");
}

static vlmd_status add_key(auth *a, const char *key, size_t n, vlmd_error *err)
{
    uint8_t (*grown)[32] = realloc(a->digests, (a->n + 1) * sizeof *grown);
    if (!grown)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for API keys");
    a->digests = grown;
    digest(key, n, a->digests[a->n++]);
    return VLMD_OK;
}

vlmd_status auth_load(auth *a, const char *key_file, const char *env_key, vlmd_error *err)
{
    memset(a, 0, sizeof *a);
    vlmd_status st = VLMD_OK;
    if (env_key && *env_key)
        st = add_key(a, env_key, strlen(env_key), err);
    if (st != VLMD_OK || !key_file || !*key_file)
        return st;
    FILE *f = fopen(key_file, "r");
    if (!f)
        return vlmd_errorf(err, VLMD_ERR_IO, "--api-key-file %s: %s", key_file, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077))
        VLMD_WARN("--api-key-file %s can be read by other users (mode %03o); chmod 600 it",
                  key_file, (unsigned)(sb.st_mode & 0777));
    char line[4096];
    size_t keys = 0;
    while (st == VLMD_OK && fgets(line, sizeof line, f)) {
        char *p = line + strspn(line, " \t");
        size_t n = strcspn(p, "\r\n");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        if (!n || p[0] == '#')
            continue;
        st = add_key(a, p, n, err);
        keys++;
    }
    fclose(f);
    if (st == VLMD_OK && !keys)
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--api-key-file %s holds no key", key_file);
    if (st != VLMD_OK)
        auth_free(a);
    return st;
}

void auth_free(auth *a)
{
    if (a->digests)
        OPENSSL_cleanse(a->digests, a->n * sizeof *a->digests);
    free(a->digests);
    memset(a, 0, sizeof *a);
}

bool auth_enabled(const auth *a)
{
    return a->n > 0;
}

bool auth_check(const auth *a, const char *header, size_t header_len, size_t *work)
{
    static const char prefix[] = "Bearer ";
    const size_t plen = sizeof prefix - 1;
    bool shaped = header && header_len > plen && strncasecmp(header, prefix, plen) == 0;
    uint8_t d[32];
    /* hash something in every case, so a missing header costs what a wrong one does */
    if (shaped)
        digest(header + plen, header_len - plen, d);
    else
        digest("", 0, d);
    bool match = false;
    size_t compared = 0;
    for (size_t i = 0; i < a->n; i++) {
        match |= CRYPTO_memcmp(d, a->digests[i], 32) == 0;
        compared += 32;
    }
    if (work)
        *work = compared;
    OPENSSL_cleanse(d, sizeof d);
    return shaped && match;
}
