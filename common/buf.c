/* buf.c - growable byte buffer, bounded string copies, strict number parsing. */
#include "buf.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

void *vlmd_grow(void *items, size_t n, size_t *cap, size_t elem, size_t first_cap)
{
    if (n < *cap)
        return items;
    if (*cap > SIZE_MAX / 2 / elem || first_cap > SIZE_MAX / elem)
        return NULL; /* the doubled size would not fit a size_t */
    size_t want = *cap ? *cap * 2 : first_cap;
    void *p = realloc(items, want * elem);
    if (p)
        *cap = want;
    return p;
}

vlmd_status vlmd_buf_reserve(vlmd_buf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return VLMD_ERR_TOO_LARGE;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return VLMD_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return VLMD_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    b->data[b->len] = '\0';
    return VLMD_OK;
}

vlmd_status vlmd_buf_append(vlmd_buf *b, const void *data, size_t len)
{
    /* data may point into b itself: find it again after a realloc */
    const char *p = data;
    bool inside = b->data && p >= b->data && p < b->data + b->cap;
    size_t offset = inside ? (size_t)(p - b->data) : 0;
    vlmd_status st = vlmd_buf_reserve(b, len);
    if (st != VLMD_OK)
        return st;
    if (inside)
        p = b->data + offset;
    if (len)
        memmove(b->data + b->len, p, len);
    b->len += len;
    b->data[b->len] = '\0';
    return VLMD_OK;
}

vlmd_status vlmd_buf_puts(vlmd_buf *b, const char *s)
{
    return vlmd_buf_append(b, s, strlen(s));
}

vlmd_status vlmd_buf_vprintf(vlmd_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return VLMD_ERR_INVALID_ARG;
    vlmd_status st = vlmd_buf_reserve(b, (size_t)n);
    if (st != VLMD_OK)
        return st;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return VLMD_OK;
}

vlmd_status vlmd_buf_printf(vlmd_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlmd_status st = vlmd_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

void vlmd_buf_clear(vlmd_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void vlmd_buf_free(vlmd_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

size_t vlmd_strlcpy(char *dst, const char *src, size_t dstsz)
{
    size_t n = strlen(src);
    if (dstsz) {
        size_t k = n < dstsz - 1 ? n : dstsz - 1;
        memcpy(dst, src, k);
        dst[k] = '\0';
    }
    return n;
}

size_t vlmd_partial_suffix(const char *text, size_t len, const char *word)
{
    for (size_t k = strlen(word); k-- > 1;)
        if (k <= len && memcmp(text + len - k, word, k) == 0)
            return k;
    return 0;
}

char *vlmd_xstrdup(const char *s)
{
    char *p = strdup(s ? s : "");
    if (!p)
        VLMD_FATAL("out of memory copying a string of %zu bytes", strlen(s));
    return p;
}

char *vlmd_asprintf(const char *fmt, ...)
{
    vlmd_buf b = VLMD_BUF_INIT;
    va_list ap;
    va_start(ap, fmt);
    vlmd_status st = vlmd_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    if (st != VLMD_OK) {
        vlmd_buf_free(&b);
        return NULL;
    }
    if (!b.data)
        return strdup("");
    return b.data;
}

vlmd_status vlmd_parse_i64(const char *s, long long min, long long max, long long *out)
{
    if (!s || !*s)
        return VLMD_ERR_INVALID_ARG;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s)
        return VLMD_ERR_INVALID_ARG;
    if (v < min || v > max)
        return VLMD_ERR_INVALID_ARG;
    *out = v;
    return VLMD_OK;
}

vlmd_status vlmd_parse_double(const char *s, double min, double max, double *out)
{
    if (!s || !*s)
        return VLMD_ERR_INVALID_ARG;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v))
        return VLMD_ERR_INVALID_ARG;
    if (v < min || v > max)
        return VLMD_ERR_INVALID_ARG;
    *out = v;
    return VLMD_OK;
}

vlmd_status vlmd_read_file(const char *path, size_t max_bytes, vlmd_buf *out, vlmd_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return vlmd_errorf(err, errno == ENOENT ? VLMD_ERR_NOT_FOUND : VLMD_ERR_IO,
                           "cannot open %s: %s", path, strerror(errno));
    vlmd_status st = VLMD_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = vlmd_errorf(err, VLMD_ERR_IO, "%s is not a regular file", path);
        goto done;
    }
    if ((size_t)sb.st_size > max_bytes) {
        st = vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s is %lld bytes, more than the %zu allowed",
                         path, (long long)sb.st_size, max_bytes);
        goto done;
    }
    vlmd_buf_clear(out);
    if (vlmd_buf_reserve(out, (size_t)sb.st_size) != VLMD_OK) {
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory to read %s", path);
        goto done;
    }
    for (;;) {
        ssize_t n = read(fd, out->data + out->len, out->cap - out->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            st = vlmd_errorf(err, VLMD_ERR_IO, "reading %s: %s", path, strerror(errno));
            goto done;
        }
        if (n == 0)
            break;
        out->len += (size_t)n;
        if (out->len + 1 == out->cap) {
            if (out->len >= max_bytes) {
                st = vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s grew past %zu bytes", path, max_bytes);
                goto done;
            }
            if (vlmd_buf_reserve(out, 4096) != VLMD_OK) {
                st = vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory to read %s", path);
                goto done;
            }
        }
    }
    out->data[out->len] = '\0';
done:
    close(fd);
    return st;
}
