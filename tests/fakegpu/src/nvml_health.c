/* GPU health reads (issue 30 item 6): remapped rows, volatile uncorrectable ECC, retired
 * pages pending, the recovery action field. Each answers what gpus[].faults in config.json
 * says; `fakegpu fault` sets it. */
#include "fg_hang.h"
#include "fg_state.h"

#include <string.h>
#include <time.h>

/* Enters, applies the GPU's faults (lost; hang-health: block unlocked first, like the hang
 * knob, so that other calls go on), and copies its faults to *out. Returns NVML_SUCCESS
 * with the lock held, or an error with it released. */
static nvmlReturn_t health_enter(const char *fn, nvmlDevice_t h, struct fg_faults *out)
{
    FG_ENTER_AS(fn, 1);
    const struct fg_gpu *gpu = fg_gpu_of(h);
    if (!gpu)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    double hang = gpu->faults.hang_health_s;
    if (hang > 0) {
        fg_leave(NVML_SUCCESS);
        fg_sleep(hang);
        FG_ENTER_AS(fn, 1);
        gpu = fg_gpu_of(h);
        if (!gpu)
            return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (gpu->faults.lost)
        return fg_leave(NVML_ERROR_GPU_IS_LOST);
    *out = gpu->faults;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corr, unsigned int *unc,
                                                unsigned int *pending, unsigned int *failure)
{
    struct fg_faults f;
    nvmlReturn_t rc = health_enter(__func__, h, &f);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!corr || !unc || !pending || !failure)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    *corr = f.remap_corr;
    *unc = f.remap_unc;
    *pending = f.remap_pending;
    *failure = f.remap_failed;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int error_type, int counter_type,
                                                  unsigned long long *count)
{
    struct fg_faults f;
    nvmlReturn_t rc = health_enter(__func__, h, &f);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count || (error_type != 0 && error_type != 1) || (counter_type != 0 && counter_type != 1))
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Only the volatile uncorrected counter is a knob; the others read 0. */
    *count = (error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED && counter_type == NVML_VOLATILE_ECC)
             ? f.ecc_volatile_unc : 0;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t h, nvmlEnableState_t *pending)
{
    struct fg_faults f;
    nvmlReturn_t rc = health_enter(__func__, h, &f);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pending)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Hopper remaps rows instead: an H100 on driver 580.159.04 answers Not Supported. */
    if (f.retired_pending < 0)
        return fg_leave(NVML_ERROR_NOT_SUPPORTED);
    *pending = f.retired_pending != 0;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t h, int count, nvmlFieldValue_t *values)
{
    struct fg_faults f;
    nvmlReturn_t rc = health_enter(__func__, h, &f);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count < 0 || (count > 0 && !values))
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof(v->value));
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = f.recovery_action;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return fg_leave(NVML_SUCCESS);
}
