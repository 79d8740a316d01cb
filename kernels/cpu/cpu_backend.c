/* cpu_backend.c - the CPU backend: host memory as the "device". It is the
 * reference implementation every CUDA op is tested against, and what CI and
 * the embedded demo run. Owns its thread pool (--threads) and picks the
 * kernel table for this CPU at open (cpu_kernels.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "host_memory.h"
#include "cpu_impl.h"
#include "log.h"
#include "safetensors.h"

/* Free is what the kernel can give (MemAvailable, within a cgroup's limit),
 * not MemFree: the page cache a checkpoint's reading left behind is given
 * back on demand, and the simulated device's default is sized the same way. */
static vlmd_status cpu_mem_info(vlmd_backend *b, uint64_t *free_bytes, uint64_t *total_bytes,
                                vlmd_error *err)
{
    (void)b, (void)err;
    vlmd_host_memory hm;
    vlmd_host_memory_read(&hm);
    *total_bytes = hm.total;
    *free_bytes = hm.room;
    return VLMD_OK;
}

static vlmd_status cpu_alloc(vlmd_backend *b, size_t bytes, void **out, vlmd_error *err)
{
    (void)b;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = rounded >= bytes ? aligned_alloc(64, rounded ? rounded : 64) : NULL;
    if (!p)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
    *out = p;
    return VLMD_OK;
}

static void cpu_free(vlmd_backend *b, void *ptr)
{
    (void)b;
    free(ptr);
}

static vlmd_status cpu_copy(vlmd_backend *b, void *dst, const void *src, size_t n, vlmd_error *err)
{
    (void)b;
    (void)err;
    memcpy(dst, src, n);
    return VLMD_OK;
}

static vlmd_status cpu_upload_f32(vlmd_backend *b, void *dst, const float *src, size_t n,
                                  vlmd_error *err)
{
    return cpu_copy(b, dst, src, n * sizeof(float), err);
}

static vlmd_status cpu_download_f32(vlmd_backend *b, float *dst, const void *src, size_t n,
                                    vlmd_error *err)
{
    return cpu_copy(b, dst, src, n * sizeof(float), err);
}

/* A CPU "graph" is the recorded call: a replay runs it again. */
struct vlmd_graph {
    vlmd_graph_fn fn;
    void *ctx;
};

static vlmd_status cpu_graph_capture(vlmd_backend *b, vlmd_graph_fn fn, void *ctx,
                                     vlmd_graph **out, vlmd_error *err)
{
    (void)b;
    vlmd_graph *g = malloc(sizeof *g);
    if (!g)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for a graph");
    *g = (vlmd_graph){fn, ctx}; /* as on a GPU, capturing runs nothing */
    *out = g;
    return VLMD_OK;
}

static vlmd_status cpu_graph_launch(vlmd_backend *b, vlmd_graph *g, vlmd_error *err)
{
    (void)b;
    (void)err;
    g->fn(g->ctx);
    return VLMD_OK;
}

static void cpu_graph_free(vlmd_backend *b, vlmd_graph *g)
{
    (void)b;
    free(g);
}

static vlmd_status cpu_synchronize(vlmd_backend *b, vlmd_error *err)
{
    (void)b;
    (void)err;
    return VLMD_OK; /* every op has returned when it is done */
}

static void cpu_destroy(vlmd_backend *b)
{
    cpu_state *cs = cpu_of(b);
    if (cs)
        vlmd_cpu_pool_destroy(cs->pool);
    free(cs);
}

static vlmd_status cpu_set_threads(vlmd_backend *b, int n, vlmd_error *err)
{
    cpu_state *cs = cpu_of(b);
    vlmd_cpu_pool *pool = NULL;
    n = n > 0 ? n : vlmd_cpu_pool_default_size();
    if (cs->pool && vlmd_cpu_pool_size(cs->pool) == n)
        return VLMD_OK;
    vlmd_status s = vlmd_cpu_pool_create(n, &pool, err);
    if (s != VLMD_OK)
        return s;
    vlmd_cpu_pool_destroy(cs->pool);
    cs->pool = pool;
    return VLMD_OK;
}

static int cpu_threads(const vlmd_backend *b)
{
    return vlmd_cpu_pool_size(((const cpu_state *)b->impl)->pool);
}

static const char *cpu_isa(const vlmd_backend *b)
{
    return ((const cpu_state *)b->impl)->k->name;
}

static const vlmd_device_vtable cpu_ops = {
    .mem_info = cpu_mem_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .upload_f32 = cpu_upload_f32,
    .download_f32 = cpu_download_f32,
    .graph_capture = cpu_graph_capture,
    .graph_launch = cpu_graph_launch,
    .graph_free = cpu_graph_free,
    .graphs_native = false,
    .ops_take_memory = false,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
    .weights_as_stored = true,
    .set_threads = cpu_set_threads,
    .threads = cpu_threads,
    .isa = cpu_isa,
};

/* The "model name" line of /proc/cpuinfo, or "cpu". */
static void cpu_model_name(char *out, size_t outsz)
{
    vlmd_strlcpy(out, "cpu", outsz);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (colon) {
            colon += strspn(colon + 1, " \t") + 1;
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(out, outsz, "cpu (%s)", colon);
        }
        break;
    }
    fclose(f);
}

extern const vlmd_op_table vlmd_cpu_op_table;

vlmd_status vlmd_cpu_backend_open(vlmd_backend *b, vlmd_error *err)
{
    b->ops = &cpu_ops;
    b->op_table = &vlmd_cpu_op_table;
    b->elem_size = sizeof(float);
    b->native_dtype = VLMD_DTYPE_F32;
    b->info.kind = VLMD_DEVICE_CPU;
    cpu_model_name(b->info.name, sizeof b->info.name);
    b->info.multiprocessors = (int)sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t free_bytes;
    vlmd_status s = cpu_mem_info(b, &free_bytes, &b->info.total_bytes, err);
    cpu_state *cs = s == VLMD_OK ? calloc(1, sizeof *cs) : NULL;
    if (s == VLMD_OK && !cs)
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the CPU backend");
    b->impl = cs;
    if (s == VLMD_OK) {
        cs->k = vlmd_cpu_kernels_best();
        s = cpu_set_threads(b, 0, err);
    }
    if (s != VLMD_OK)
        cpu_destroy(b);
    return s;
}
