#include "fg_config.h"
#include "fg_json.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fg_path(char *out, size_t size, const char *rel_fmt, ...)
{
    const char *root = getenv("FAKEGPU_ROOT");
    if (!root || !*root)
        root = "/";
    size_t rlen = strlen(root);
    while (rlen > 1 && root[rlen - 1] == '/')
        rlen--;
    int n = (rlen == 1 && root[0] == '/') ? 0 : snprintf(out, size, "%.*s", (int)rlen, root);
    if (n < 0 || (size_t)n >= size)
        return -1;
    va_list ap;
    va_start(ap, rel_fmt);
    char rel[512];
    int m = vsnprintf(rel, sizeof(rel), rel_fmt, ap);
    va_end(ap);
    if (m < 0 || (size_t)m >= sizeof(rel))
        return -1;
    int k = snprintf(out + n, size - (size_t)n, "/%s", rel[0] == '/' ? rel + 1 : rel);
    return (k < 0 || (size_t)k >= size - (size_t)n) ? -1 : 0;
}

int fg_parse_bus_id(const char *text, unsigned *domain, unsigned *bus,
                    unsigned *device, unsigned *function)
{
    char tail;
    if (sscanf(text, "%x:%x:%x.%x%c", domain, bus, device, function, &tail) != 4)
        return -1;
    return (*bus > 0xff || *device > 0x1f || *function > 7) ? -1 : 0;
}

static char *read_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) == 0 && st.st_size < (1 << 22)) {
        buf = malloc((size_t)st.st_size + 1);
        ssize_t got = buf ? read(fd, buf, (size_t)st.st_size) : -1;
        if (got >= 0)
            buf[got] = '\0';
        else {
            free(buf);
            buf = NULL;
        }
    }
    close(fd);
    return buf;
}

static double num_or(const struct fg_json *obj, const char *key, double fallback)
{
    const struct fg_json *v = fg_json_get(obj, key);
    return (v && v->type == FG_JNUM) ? v->num : fallback;
}

static void str_into(const struct fg_json *obj, const char *key, char *dst, size_t size,
                     const char *fallback)
{
    const struct fg_json *v = fg_json_get(obj, key);
    snprintf(dst, size, "%s", (v && v->type == FG_JSTR) ? v->str : fallback);
}

static int load_gpu(const struct fg_json *g, struct fg_gpu *out)
{
    double index = num_or(g, "index", -1);
    double minor = num_or(g, "minor", -1);
    if (index < 0 || minor < 0)
        return -1;
    out->index = (unsigned)index;
    out->minor = (unsigned)minor;
    str_into(g, "uuid", out->uuid, sizeof(out->uuid), "");
    str_into(g, "name", out->name, sizeof(out->name), "NVIDIA H200");
    str_into(g, "pci_bus_id", out->bus_id, sizeof(out->bus_id), "");
    if (!out->uuid[0] || fg_parse_bus_id(out->bus_id, &out->domain, &out->bus,
                                         &out->device, &out->function))
        return -1;
    out->memory_total_mib = (unsigned long long)num_or(g, "memory_total_mib", 97887);
    out->reserved_mib = (unsigned long long)num_or(g, "reserved_mib", 615);
    out->leaked_mib = (unsigned long long)num_or(g, "leaked_mib", 0);
    out->context_uncharged_mib = (unsigned long long)num_or(g, "context_uncharged_mib", 0);
    /* No "faults": a healthy Hopper board, as measured on an H100 with driver 580.159.04
     * (remapped rows 0,0,0,0; retired pages Not Supported; recovery action 0). */
    const struct fg_json *f = fg_json_get(g, "faults");
    out->faults.lost = num_or(f, "lost", 0) != 0;
    out->faults.remap_corr = (unsigned)num_or(f, "remap_corr", 0);
    out->faults.remap_unc = (unsigned)num_or(f, "remap_unc", 0);
    out->faults.remap_pending = num_or(f, "remap_pending", 0) != 0;
    out->faults.remap_failed = num_or(f, "remap_failed", 0) != 0;
    out->faults.ecc_volatile_unc = (unsigned long long)num_or(f, "ecc_volatile_unc", 0);
    out->faults.retired_pending = (int)num_or(f, "retired_pending", -1);
    out->faults.recovery_action = (unsigned)num_or(f, "recovery_action", 0);
    out->faults.hang_health_s = num_or(f, "hang_health_s", 0);
    return 0;
}

static void load_hang(const struct fg_json *hang, struct fg_config *cfg)
{
    cfg->hang_all = 0;
    cfg->hang_ncalls = 0;
    cfg->hang_seconds = num_or(hang, "seconds", 3600);
    const struct fg_json *calls = fg_json_get(hang, "calls");
    if (!calls || calls->type != FG_JARR)
        return;
    for (const struct fg_json *c = calls->child; c; c = c->next) {
        if (c->type != FG_JSTR)
            continue;
        if (!strcmp(c->str, "all"))
            cfg->hang_all = 1;
        else if (cfg->hang_ncalls < FG_MAX_HANG_CALLS)
            snprintf(cfg->hang_calls[cfg->hang_ncalls++], 64, "%s", c->str);
    }
}

static int load(const char *text, struct fg_config *cfg)
{
    struct fg_json *root = fg_json_parse(text);
    const struct fg_json *gpus = fg_json_get(root, "gpus");
    int rc = -1;
    if (!gpus || gpus->type != FG_JARR)
        goto out;
    memset(cfg, 0, sizeof(*cfg));
    unsigned seen = 0;
    for (const struct fg_json *g = gpus->child; g; g = g->next) {
        struct fg_gpu gpu;
        if (seen >= FG_MAX_GPUS || load_gpu(g, &gpu) || gpu.index >= FG_MAX_GPUS)
            goto out;
        if (cfg->gpus[gpu.index].uuid[0])   /* duplicate index */
            goto out;
        cfg->gpus[gpu.index] = gpu;
        seen++;
    }
    for (unsigned i = 0; i < seen; i++)      /* indices must be 0..N-1 */
        if (!cfg->gpus[i].uuid[0])
            goto out;
    cfg->count = seen;
    cfg->release_lag_ms = (long long)num_or(root, "release_lag_ms", 0);
    load_hang(fg_json_get(root, "hang"), cfg);
    str_into(root, "driver_version", cfg->driver_version, sizeof(cfg->driver_version),
             "580.159.04");
    cfg->cuda_version = (int)num_or(root, "cuda_version", 13000);
    rc = 0;
out:
    fg_json_free(root);
    return rc;
}

/* The config is tiny, but re-parsing it on every NVML call would still dominate a burst
 * of process queries: re-read only when the file was replaced or changed. */
int fg_config_refresh(struct fg_config *cfg)
{
    char path[4096];
    struct stat st;
    if (fg_path(path, sizeof(path), "etc/fakegpu/config.json") || stat(path, &st)) {
        cfg->loaded = 0;
        return -1;
    }
    const struct stat *old = &cfg->source;
    if (cfg->loaded && st.st_ino == old->st_ino && st.st_dev == old->st_dev &&
        st.st_size == old->st_size && st.st_mtim.tv_sec == old->st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == old->st_mtim.tv_nsec)
        return 0;
    char *text = read_file(path);
    struct fg_config fresh;
    int rc = (text && load(text, &fresh) == 0) ? 0 : -1;
    free(text);
    if (rc == 0) {
        *cfg = fresh;
        cfg->source = st;
        cfg->loaded = 1;
    } else {
        cfg->loaded = 0;
    }
    return rc;
}
