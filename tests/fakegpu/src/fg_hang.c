#include "fg_hang.h"

#include <errno.h>
#include <string.h>
#include <time.h>

/* "nvmlDeviceGetCount_v2" and "nvmlDeviceGetCount" name the same call for the knob. */
static size_t base_len(const char *name)
{
    size_t n = strlen(name);
    const char *v = strrchr(name, '_');
    if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9')
        n = (size_t)(v - name);
    return n;
}

double fg_hang_seconds(const struct fg_config *cfg, const char *fn)
{
    if (!cfg->loaded || cfg->hang_seconds <= 0)
        return 0;
    if (cfg->hang_all)
        return cfg->hang_seconds;
    size_t n = base_len(fn);
    for (int i = 0; i < cfg->hang_ncalls; i++) {
        const char *want = cfg->hang_calls[i];
        if (base_len(want) == n && !strncmp(want, fn, n))
            return cfg->hang_seconds;
        /* pynvml's nvmlInit() calls nvmlInitWithFlags. */
        if (!strcmp(want, "nvmlInit") && !strcmp(fn, "nvmlInitWithFlags"))
            return cfg->hang_seconds;
    }
    return 0;
}

void fg_sleep(double seconds)
{
    struct timespec left = { (time_t)seconds,
                             (long)((seconds - (double)(time_t)seconds) * 1e9) };
    while (nanosleep(&left, &left) && errno == EINTR)
        ;
}
