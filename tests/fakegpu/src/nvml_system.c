/* Init/shutdown, error strings and system-wide queries. */
#include "fg_alloc.h"
#include "fg_dev.h"
#include "fg_state.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    FG_ENTER(0);
    if (fg_initialized()) {
        fg_set_initialized(+1);
        return fg_leave(NVML_SUCCESS);
    }
    /* No config or no device files: what NVML says on a host without the driver. */
    if (!fg_cfg.loaded || fg_dev_open_all(&fg_cfg))
        return fg_leave(NVML_ERROR_DRIVER_NOT_LOADED);
    fg_pidns = fg_self_pidns();
    fg_set_initialized(+1);
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
NVML_API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

NVML_API nvmlReturn_t nvmlShutdown(void)
{
    FG_ENTER(1);
    fg_set_initialized(-1);
    if (!fg_initialized())
        fg_dev_close_all();
    return fg_leave(NVML_SUCCESS);
}

NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    FG_ENTER(1);
    return fg_leave(fg_copy_str(version, length, fg_cfg.driver_version));
}

NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    FG_ENTER(1);
    char text[96];
    snprintf(text, sizeof(text), "13.%s", fg_cfg.driver_version);
    return fg_leave(fg_copy_str(version, length, text));
}

static nvmlReturn_t cuda_version(const char *fn, int *out)
{
    FG_ENTER_AS(fn, 0);      /* works before nvmlInit, as the real one does */
    if (!out)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = fg_cfg.cuda_version;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(__func__, v); }
NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(__func__, v); }

/* Name of any process on the host, as NVML reports it for its process lists. */
NVML_API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    FG_ENTER(1);
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%u/comm", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fg_leave(NVML_ERROR_NOT_FOUND);
    ssize_t got = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (got <= 0)
        return fg_leave(NVML_ERROR_NOT_FOUND);
    buf[got] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return fg_leave(fg_copy_str(name, length, buf));
}
