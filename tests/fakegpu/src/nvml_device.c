/* Device enumeration and identity: count, handles, name, uuid, PCI, minor, persistence. */
#include "fg_state.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define GPU_OR_INVALID(gpu, handle)                          \
    const struct fg_gpu *gpu = fg_gpu_of(handle);            \
    if (!gpu)                                                \
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT)

static nvmlReturn_t get_count(const char *fn, unsigned int *count)
{
    FG_ENTER_AS(fn, 1);
    if (!count)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = fg_cfg.count;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return get_count(__func__, c); }
NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { return get_count(__func__, c); }

static nvmlReturn_t by_index(const char *fn, unsigned int index, nvmlDevice_t *device)
{
    FG_ENTER_AS(fn, 1);
    nvmlDevice_t h = fg_handle_for(index);
    if (!device || !h)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* A GPU that fell off the bus: nvidia-smi says "Unable to determine the device handle
     * for GPU ...: GPU is lost. Reboot the system to recover this GPU". */
    if (fg_cfg.gpus[index].faults.lost)
        return fg_leave(NVML_ERROR_GPU_IS_LOST);
    *device = h;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return by_index(__func__, i, d); }
NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return by_index(__func__, i, d); }

NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    FG_ENTER(1);
    if (!uuid || !device)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < fg_cfg.count; i++)
        if (!strcasecmp(fg_cfg.gpus[i].uuid, uuid)) {
            *device = fg_handle_for(i);
            return fg_leave(NVML_SUCCESS);
        }
    return fg_leave(NVML_ERROR_NOT_FOUND);
}

/* Accepts the 4- and 8-digit domain forms, any case, as the real one does. */
static nvmlReturn_t by_bus_id(const char *name, const char *bus_id, nvmlDevice_t *device)
{
    FG_ENTER_AS(name, 1);
    unsigned dom, bus, dev, fn;
    if (!bus_id || !device)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (fg_parse_bus_id(bus_id, &dom, &bus, &dev, &fn))
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < fg_cfg.count; i++) {
        const struct fg_gpu *g = &fg_cfg.gpus[i];
        if (g->domain == dom && g->bus == bus && g->device == dev && g->function == fn) {
            *device = fg_handle_for(i);
            return fg_leave(NVML_SUCCESS);
        }
    }
    return fg_leave(NVML_ERROR_NOT_FOUND);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) { return by_bus_id(__func__, b, d); }
NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *b, nvmlDevice_t *d) { return by_bus_id(__func__, b, d); }

NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    return fg_leave(fg_copy_str(name, length, gpu->name));
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    return fg_leave(fg_copy_str(uuid, length, gpu->uuid));
}

NVML_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    if (!minor)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    *minor = gpu->minor;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *index)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    if (!index)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = gpu->index;
    return fg_leave(NVML_SUCCESS);
}

#define H200_PCI_DEVICE_ID 0x233510DEu
#define H200_PCI_SUBSYS_ID 0x18B010DEu

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    if (!pci)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X",
             gpu->domain & 0xffff, gpu->bus, gpu->device, gpu->function);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X",
             gpu->domain, gpu->bus, gpu->device, gpu->function);
    pci->domain = gpu->domain;
    pci->bus = gpu->bus;
    pci->device = gpu->device;
    pci->pciDeviceId = H200_PCI_DEVICE_ID;
    pci->pciSubSystemId = H200_PCI_SUBSYS_ID;
    return fg_leave(NVML_SUCCESS);
}

static nvmlReturn_t pci_legacy(nvmlDevice_t h, nvmlPciInfo_v2_t *pci)
{
    nvmlPciInfo_t full;
    nvmlReturn_t rc = nvmlDeviceGetPciInfo_v3(h, &full);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    memcpy(pci->busId, full.busIdLegacy, sizeof(pci->busId));
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_v2_t *p) { return pci_legacy(h, p); }
NVML_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfo_v2_t *p) { return pci_legacy(h, p); }

/* Persistence mode lives in var/lib/fakegpu/persistence-<minor> ("0"/"1"), default off. */
NVML_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, nvmlEnableState_t *mode)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    if (!mode)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    char path[4096];
    *mode = 0;
    if (!fg_path(path, sizeof(path), "var/lib/fakegpu/persistence-%u", gpu->minor)) {
        FILE *f = fopen(path, "re");
        if (f) {
            *mode = fgetc(f) == '1';
            fclose(f);
        }
    }
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t h, nvmlEnableState_t mode)
{
    FG_ENTER(1);
    GPU_OR_INVALID(gpu, h);
    if (mode != 0 && mode != 1)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (geteuid() != 0)
        return fg_leave(NVML_ERROR_NO_PERMISSION);
    char path[4096], tmp[4096];
    if (fg_path(path, sizeof(path), "var/lib/fakegpu/persistence-%u", gpu->minor) ||
        fg_path(tmp, sizeof(tmp), "var/lib/fakegpu/.persistence-%u.%d", gpu->minor, getpid()))
        return fg_leave(NVML_ERROR_UNKNOWN);
    FILE *f = fopen(tmp, "we");
    if (!f)
        return fg_leave(NVML_ERROR_UNKNOWN);
    fprintf(f, "%d\n", mode);
    int ok = fclose(f) == 0 && rename(tmp, path) == 0;
    if (!ok)
        unlink(tmp);
    return fg_leave(ok ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}
