/* The stand-in's view of $FAKEGPU_ROOT/etc/fakegpu/config.json, reloaded when it changes. */
#ifndef FG_CONFIG_H
#define FG_CONFIG_H

#include <stddef.h>
#include <sys/stat.h>

#define FG_MAX_GPUS 64
#define FG_MAX_HANG_CALLS 32

struct fg_gpu {
    unsigned index;
    unsigned minor;
    char uuid[96];
    char name[96];
    char bus_id[32];            /* "00000000:18:00.0" */
    unsigned domain, bus, device, function;
    unsigned long long memory_total_mib;
    unsigned long long reserved_mib;
    unsigned long long leaked_mib;
    unsigned long long context_uncharged_mib;   /* used per live context, listed for nobody */
    struct fg_faults {          /* config.json gpus[].faults: what the health reads answer */
        int lost;               /* every call on it: NVML_ERROR_GPU_IS_LOST */
        unsigned remap_corr, remap_unc, remap_pending, remap_failed;
        unsigned long long ecc_volatile_unc;
        int retired_pending;    /* -1: Not Supported (Ampere and later), else 0/1 */
        unsigned recovery_action;
        double hang_health_s;   /* > 0: each health read blocks this long first */
    } faults;
};

struct fg_config {
    unsigned count;
    struct fg_gpu gpus[FG_MAX_GPUS];   /* ordered by index */
    long long release_lag_ms;
    int hang_all;
    int hang_ncalls;
    char hang_calls[FG_MAX_HANG_CALLS][64];
    double hang_seconds;
    char driver_version[80];
    int cuda_version;
    struct stat source;         /* the file this was read from, to notice changes */
    int loaded;
};

/* Joins $FAKEGPU_ROOT and a path relative to it. Returns 0, or -1 if it does not fit. */
int fg_path(char *out, size_t size, const char *rel_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Refreshes *cfg from disk when the file changed since the last call.
 * Returns 0 when *cfg is valid, -1 when the config is missing or malformed. */
int fg_config_refresh(struct fg_config *cfg);

/* Parses a PCI bus id ("0000:18:00.0" or "00000000:18:00.0"); 0 on success. */
int fg_parse_bus_id(const char *text, unsigned *domain, unsigned *bus,
                    unsigned *device, unsigned *function);

#endif
