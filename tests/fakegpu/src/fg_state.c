#include "fg_state.h"
#include "fg_hang.h"

#include <pthread.h>
#include <string.h>

struct fg_config fg_cfg;
unsigned long long fg_pidns;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;

/* Handles are addresses in this table: stable across config reloads, and easy to check. */
struct nvmlDevice_st { unsigned index; };
static struct nvmlDevice_st handles[FG_MAX_GPUS];

nvmlReturn_t fg_enter(const char *fn, int need_init)
{
    pthread_mutex_lock(&lock);
    fg_config_refresh(&fg_cfg);
    double hang = fg_hang_seconds(&fg_cfg, fn);
    if (hang > 0) {
        /* Sleep unlocked so that other threads' calls behave per their own knob. */
        pthread_mutex_unlock(&lock);
        fg_sleep(hang);
        pthread_mutex_lock(&lock);
        fg_config_refresh(&fg_cfg);
    }
    if (need_init && refcount == 0) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t fg_leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&lock);
    return rc;
}

int fg_initialized(void) { return refcount > 0; }
void fg_set_initialized(int delta) { refcount += delta; }

nvmlDevice_t fg_handle_for(unsigned index)
{
    if (index >= fg_cfg.count)
        return NULL;
    handles[index].index = index;
    return &handles[index];
}

const struct fg_gpu *fg_gpu_of(nvmlDevice_t handle)
{
    if (handle < handles || handle >= handles + FG_MAX_GPUS)
        return NULL;
    unsigned index = (unsigned)(handle - handles);
    return (fg_cfg.loaded && index < fg_cfg.count) ? &fg_cfg.gpus[index] : NULL;
}

nvmlReturn_t fg_copy_str(char *dst, unsigned int size, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}
