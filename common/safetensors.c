/* safetensors.c - mmapped safetensors files with a fully validated header.
 * Owns the mappings and the tensor table (names copied out of the header). */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "buf.h"
#include "fp8.h"

typedef struct mapped_file {
    void *base;
    size_t size;
    bool borrowed;      /* the caller's memory: not unmapped */
} mapped_file;

struct vlmd_safetensors {
    mapped_file *files;
    size_t n_files;
    vlmd_tensor_view *tensors;  /* sorted by name */
    size_t n_tensors;
};

static const struct {
    const char *name;
    vlmd_dtype dtype;
    size_t size;
} dtypes[] = {
    {"F32", VLMD_DTYPE_F32, 4}, {"F16", VLMD_DTYPE_F16, 2}, {"BF16", VLMD_DTYPE_BF16, 2},
    {"I64", VLMD_DTYPE_I64, 8}, {"I32", VLMD_DTYPE_I32, 4}, {"U8", VLMD_DTYPE_U8, 1},
    {"F8_E4M3", VLMD_DTYPE_F8_E4M3, 1},
};

const char *vlmd_dtype_str(vlmd_dtype d)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dtype == d)
            return dtypes[i].name;
    return "?";
}

size_t vlmd_dtype_size(vlmd_dtype d)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dtype == d)
            return dtypes[i].size;
    return 0;
}

float vlmd_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float vlmd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant) { /* subnormal: normalize */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int64_t vlmd_tensor_numel(const vlmd_tensor_view *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

vlmd_status vlmd_tensor_to_f32(const vlmd_tensor_view *t, float *dst, vlmd_error *err)
{
    int64_t n = vlmd_tensor_numel(t);
    const uint16_t *h = t->data;
    switch (t->dtype) {
    case VLMD_DTYPE_F32:
        memcpy(dst, t->data, (size_t)n * sizeof(float));
        return VLMD_OK;
    case VLMD_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, h + i, sizeof v);
            dst[i] = vlmd_bf16_to_f32(v);
        }
        return VLMD_OK;
    case VLMD_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, h + i, sizeof v);
            dst[i] = vlmd_f16_to_f32(v);
        }
        return VLMD_OK;
    case VLMD_DTYPE_F8_E4M3:
        for (int64_t i = 0; i < n; i++)
            dst[i] = vlmd_e4m3_to_f32(((const uint8_t *)t->data)[i]);
        return VLMD_OK;
    default:
        return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s is %s, not a float type", t->name,
                           vlmd_dtype_str(t->dtype));
    }
}

/* ---- opening ------------------------------------------------------------- */

static vlmd_status map_file(const char *path, mapped_file *mf, vlmd_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return vlmd_errorf(err, errno == ENOENT ? VLMD_ERR_NOT_FOUND : VLMD_ERR_IO,
                           "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    vlmd_status st = VLMD_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = vlmd_errorf(err, VLMD_ERR_IO, "%s is not a regular file", path);
    } else if (sb.st_size < 8) {
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %lld bytes is too short for a safetensors "
                         "header", path, (long long)sb.st_size);
    } else {
        mf->size = (size_t)sb.st_size;
        mf->base = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mf->base == MAP_FAILED) {
            mf->base = NULL;
            st = vlmd_errorf(err, VLMD_ERR_IO, "cannot map %s: %s", path, strerror(errno));
        }
    }
    close(fd);
    return st;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const vlmd_tensor_view *)a)->name, ((const vlmd_tensor_view *)b)->name);
}

static int by_offset(const void *a, const void *b)
{
    const vlmd_tensor_view *x = *(const vlmd_tensor_view *const *)a;
    const vlmd_tensor_view *y = *(const vlmd_tensor_view *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Parses one tensor entry of the header. */
static vlmd_status parse_entry(const char *path, const char *name, json_t *v, const uint8_t *data,
                               size_t data_size, vlmd_tensor_view *t, vlmd_error *err)
{
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !dt || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s lacks dtype, shape or "
                           "data_offsets", path, name);
    size_t k;
    for (k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
        if (strcmp(dt, dtypes[k].name) == 0)
            break;
    if (k == sizeof dtypes / sizeof dtypes[0])
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s has unsupported dtype %s", path,
                           name, dt);
    t->dtype = dtypes[k].dtype;
    if (json_array_size(shape) > VLMD_TENSOR_MAX_DIMS)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s has %zu dimensions", path, name,
                           json_array_size(shape));
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > (json_int_t)1 << 40)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s has a bad dimension %d", path,
                               name, d);
        t->shape[d] = json_integer_value(x);
        if (t->shape[d] && numel > UINT64_MAX / (uint64_t)t->shape[d])
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s is too large", path, name);
        numel *= (uint64_t)t->shape[d];
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b) ||
        (uint64_t)json_integer_value(e) > data_size)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s has data_offsets outside the "
                           "%zu bytes of data", path, name, data_size);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    if (numel > UINT64_MAX / dtypes[k].size || end - begin != numel * dtypes[k].size)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s: %s of %llu elements needs %llu "
                           "bytes, its offsets span %llu", path, name, dt,
                           (unsigned long long)numel,
                           (unsigned long long)(numel * dtypes[k].size),
                           (unsigned long long)(end - begin));
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    t->name = strdup(name);
    return t->name ? VLMD_OK : vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
}

/* Appends the tensors of one mapped file to st->tensors. */
static vlmd_status load_header(vlmd_safetensors *st, const char *path, const mapped_file *mf,
                               vlmd_error *err)
{
    const uint8_t *p = mf->base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > VLMD_SAFETENSORS_MAX_HEADER)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: header of %llu bytes, more than %u", path,
                           (unsigned long long)hlen, VLMD_SAFETENSORS_MAX_HEADER);
    if (hlen > mf->size - 8)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: header of %llu bytes runs past the end of "
                           "the %zu-byte file (truncated?)", path, (unsigned long long)hlen,
                           mf->size);
    json_error_t jerr;
    json_t *h = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(h)) {
        json_decref(h);
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: header is not a JSON object (%s)", path,
                           jerr.text);
    }
    const uint8_t *data = p + 8 + hlen;
    size_t data_size = mf->size - 8 - (size_t)hlen;
    size_t first = st->n_tensors, n = json_object_size(h);
    vlmd_tensor_view *grown = realloc(st->tensors, (first + n) * sizeof *grown);
    vlmd_status s = VLMD_OK;
    if (!grown) {
        json_decref(h);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    st->tensors = grown;
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v)
    {
        if (strcmp(name, "__metadata__") == 0)
            continue;
        vlmd_tensor_view *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        if ((s = parse_entry(path, name, v, data, data_size, t, err)) != VLMD_OK)
            break;
        st->n_tensors++;
    }
    json_decref(h);
    if (s != VLMD_OK)
        return s;
    /* No two tensors of this file may share bytes. */
    size_t m = st->n_tensors - first;
    const vlmd_tensor_view **order = malloc((m ? m : 1) * sizeof *order);
    if (!order)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m; i++)
        order[i] = &st->tensors[first + i];
    qsort(order, m, sizeof *order, by_offset);
    for (size_t i = 1; i < m && s == VLMD_OK; i++)
        if ((const uint8_t *)order[i - 1]->data + order[i - 1]->nbytes >
            (const uint8_t *)order[i]->data)
            s = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensors %s and %s overlap", path,
                            order[i - 1]->name, order[i]->name);
    free(order);
    return s;
}

static vlmd_status add_file(vlmd_safetensors *st, const char *path, vlmd_error *err)
{
    mapped_file *grown = realloc(st->files, (st->n_files + 1) * sizeof *grown);
    if (!grown)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    st->files = grown;
    mapped_file *mf = &st->files[st->n_files];
    *mf = (mapped_file){0};
    vlmd_status s = map_file(path, mf, err);
    if (s != VLMD_OK)
        return s;
    st->n_files++;
    return load_header(st, path, mf, err);
}

/* Sorts by name and refuses a name that two shards both hold. */
static vlmd_status finish(vlmd_safetensors *st, vlmd_error *err)
{
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, by_name);
    for (size_t i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s appears in two files",
                               st->tensors[i].name);
    return VLMD_OK;
}

/* Where an opening ends: the checked table handed out on success (s so
 * far), everything closed on failure. */
static vlmd_status finish_into(vlmd_safetensors *st, vlmd_status s, vlmd_safetensors **out,
                               vlmd_error *err)
{
    if (s == VLMD_OK)
        s = finish(st, err);
    if (s != VLMD_OK) {
        vlmd_safetensors_close(st);
        return s;
    }
    *out = st;
    return VLMD_OK;
}

vlmd_status vlmd_safetensors_open_memory(const void *data, size_t len, vlmd_safetensors **out,
                                         vlmd_error *err)
{
    *out = NULL;
    if (len < 8)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%zu bytes is too short for a safetensors header",
                           len);
    vlmd_safetensors *st = calloc(1, sizeof *st);
    mapped_file *mf = calloc(1, sizeof *mf);
    if (!st || !mf) {
        free(st);
        free(mf);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    *mf = (mapped_file){.base = (void *)data, .size = len, .borrowed = true};
    st->files = mf;
    st->n_files = 1;
    vlmd_status s = load_header(st, "(memory)", mf, err);
    return finish_into(st, s, out, err);
}

vlmd_status vlmd_safetensors_open_file(const char *path, vlmd_safetensors **out, vlmd_error *err)
{
    *out = NULL;
    vlmd_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    vlmd_status s = add_file(st, path, err);
    return finish_into(st, s, out, err);
}

/* Opens the shards named by DIR/model.safetensors.index.json's weight_map
 * and checks that each listed tensor is in the shard the index names. */
static vlmd_status open_sharded(vlmd_safetensors *st, const char *dir, const char *index,
                                vlmd_error *err)
{
    json_error_t jerr;
    json_t *j = json_load_file(index, JSON_REJECT_DUPLICATES, &jerr);
    json_t *map = json_object_get(j, "weight_map");
    vlmd_status s = VLMD_OK;
    if (!json_is_object(map)) {
        json_decref(j);
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: no weight_map object (%s)", index,
                           jerr.text);
    }
    json_t *files = json_object(); /* shard name -> true, to open each once */
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v)
    {
        const char *shard = json_string_value(v);
        if (!shard || strchr(shard, '/') || strcmp(shard, "..") == 0) {
            s = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: tensor %s maps to a bad file name", index,
                            name);
            break;
        }
        json_object_set_new(files, shard, json_true());
    }
    json_object_foreach(files, name, v)
    {
        if (s != VLMD_OK)
            break;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        s = add_file(st, path, err);
    }
    if (s == VLMD_OK)
        s = finish(st, err);
    json_object_foreach(map, name, v)
    {
        if (s != VLMD_OK)
            break;
        if (!vlmd_safetensors_find(st, name))
            s = vlmd_errorf(err, VLMD_ERR_MODEL, "%s lists tensor %s, but %s does not hold it",
                            index, name, json_string_value(v));
    }
    json_decref(files);
    json_decref(j);
    return s;
}

vlmd_status vlmd_safetensors_open_dir(const char *dir, vlmd_safetensors **out, vlmd_error *err)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        return vlmd_safetensors_open_file(path, out, err);
    }
    vlmd_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    vlmd_status s = open_sharded(st, dir, path, err);
    if (s != VLMD_OK) {
        vlmd_safetensors_close(st);
        return s;
    }
    *out = st;
    return VLMD_OK;
}

void vlmd_safetensors_close(vlmd_safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_files; i++)
        if (!st->files[i].borrowed)
            munmap(st->files[i].base, st->files[i].size);
    free(st->tensors);
    free(st->files);
    free(st);
}

void vlmd_safetensors_release(const vlmd_safetensors *st, const vlmd_tensor_view *t)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)t->data + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t hi = ((uintptr_t)t->data + t->nbytes) & ~((uintptr_t)page - 1);
    for (size_t i = 0; hi > lo && i < st->n_files; i++) {
        const mapped_file *mf = &st->files[i];
        uintptr_t b = (uintptr_t)mf->base;
        /* only whole pages of a read-only file mapping: they read back from the file */
        if (!mf->borrowed && lo >= b && hi <= b + mf->size)
            madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}

size_t vlmd_safetensors_count(const vlmd_safetensors *st)
{
    return st->n_tensors;
}

const vlmd_tensor_view *vlmd_safetensors_at(const vlmd_safetensors *st, size_t i)
{
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

const vlmd_tensor_view *vlmd_safetensors_find(const vlmd_safetensors *st, const char *name)
{
    vlmd_tensor_view key = {.name = name};
    return bsearch(&key, st->tensors, st->n_tensors, sizeof key, by_name);
}

static void shape_str(const int64_t *shape, int ndim, char *out, size_t outsz)
{
    size_t n = (size_t)snprintf(out, outsz, "[");
    for (int d = 0; d < ndim && n < outsz; d++)
        n += (size_t)snprintf(out + n, outsz - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < outsz)
        snprintf(out + n, outsz - n, "]");
}

vlmd_status vlmd_safetensors_get(const vlmd_safetensors *st, const char *name, int ndim,
                                 const int64_t *shape, const vlmd_tensor_view **out,
                                 vlmd_error *err)
{
    const vlmd_tensor_view *t = vlmd_safetensors_find(st, name);
    char want[160], got[160];
    shape_str(shape, ndim, want, sizeof want);
    if (!t)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "missing tensor %s (expected shape %s)", name,
                           want);
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        shape_str(t->shape, t->ndim, got, sizeof got);
        return vlmd_errorf(err, VLMD_ERR_MODEL, "tensor %s has shape %s, expected %s", name, got,
                           want);
    }
    *out = t;
    return VLMD_OK;
}
