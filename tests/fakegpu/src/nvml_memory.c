/* Memory and process queries, computed from the allocation registry and the knobs. */
#include "fg_alloc.h"
#include "fg_state.h"

#include <string.h>

#define MIB (1024ull * 1024ull)
#define MAX_ALLOCS 16384

static struct fg_alloc allocs[MAX_ALLOCS];   /* guarded by the API lock */

/* MiB held on this GPU by contexts (alive, or dead within the release lag), with what the
 * driver uses for each context and charges to no process (context_uncharged_mib; a real H200,
 * driver 580: used exceeds the sum of the process list by 8 MiB for 1 context, 14 for 2, 49 for
 * 8, 141 for 24: tests/gpu reports). */
static unsigned long long context_mib(const struct fg_gpu *gpu, int n)
{
    unsigned long long sum = 0;
    for (int i = 0; i < n && i < MAX_ALLOCS; i++)
        if (allocs[i].minor == gpu->minor)
            sum += allocs[i].mib + (allocs[i].peer ? 0 : gpu->context_uncharged_mib);
    return sum;
}

static int collect(void)
{
    int n = fg_alloc_collect(fg_cfg.release_lag_ms, allocs, MAX_ALLOCS);
    return n < 0 ? 0 : n;
}

/* Like a real H200: v1 counts the reserved memory as used, v2 reports it on its own. */
NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *memory)
{
    FG_ENTER(1);
    const struct fg_gpu *gpu = fg_gpu_of(h);
    if (!gpu || !memory)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long used = gpu->reserved_mib + gpu->leaked_mib + context_mib(gpu, collect());
    unsigned long long total = gpu->memory_total_mib;
    if (used > total)
        used = total;
    memory->total = total * MIB;
    memory->used = used * MIB;
    memory->free = (total - used) * MIB;
    return fg_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *memory)
{
    FG_ENTER(1);
    const struct fg_gpu *gpu = fg_gpu_of(h);
    if (!gpu || !memory)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2)
        return fg_leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total = gpu->memory_total_mib;
    unsigned long long reserved = gpu->reserved_mib > total ? total : gpu->reserved_mib;
    unsigned long long used = gpu->leaked_mib + context_mib(gpu, collect());
    if (used > total - reserved)
        used = total - reserved;
    memory->total = total * MIB;
    memory->reserved = reserved * MIB;
    memory->used = used * MIB;
    memory->free = (total - reserved - used) * MIB;
    return fg_leave(NVML_SUCCESS);
}

/* One row per creator PID that this caller can name: contexts created in another PID
 * namespace count as used memory but cannot be listed ("memory used, no processes"), and so
 * does peer memory, which a real driver charges to nobody (NCCL buffers mapped from a
 * process whose context is on another GPU, measured on 2x H200). */
static unsigned list_compute(const struct fg_gpu *gpu, nvmlProcessInfo_v2_t *rows, unsigned max)
{
    int n = collect();
    unsigned count = 0;
    for (int i = 0; i < n && i < MAX_ALLOCS; i++) {
        const struct fg_alloc *a = &allocs[i];
        if (a->minor != gpu->minor || a->pidns != fg_pidns || a->peer)
            continue;
        unsigned j = 0;
        while (j < count && rows[j].pid != a->pid)
            j++;
        if (j == count) {
            if (count == max)
                continue;
            rows[count].pid = a->pid;
            rows[count].usedGpuMemory = 0;
            rows[count].gpuInstanceId = 0xFFFFFFFFu;     /* not a MIG instance */
            rows[count].computeInstanceId = 0xFFFFFFFFu;
            count++;
        }
        rows[j].usedGpuMemory += a->mib * MIB;
    }
    return count;
}

static nvmlProcessInfo_v2_t rows_buf[MAX_ALLOCS];

/* NVML's size protocol: report the count with NVML_ERROR_INSUFFICIENT_SIZE when the caller's
 * array is missing or too small; SUCCESS with count 0 when there is nothing to list. */
static nvmlReturn_t processes(const char *fn, nvmlDevice_t h, unsigned int *count,
                              void *infos, int v1, int compute)
{
    FG_ENTER_AS(fn, 1);
    const struct fg_gpu *gpu = fg_gpu_of(h);
    if (!gpu || !count)
        return fg_leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = compute ? list_compute(gpu, rows_buf, MAX_ALLOCS) : 0;
    if (n == 0) {
        *count = 0;
        return fg_leave(NVML_SUCCESS);
    }
    if (!infos || *count < n) {
        *count = n;
        return fg_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + i;
            out->pid = rows_buf[i].pid;
            out->usedGpuMemory = rows_buf[i].usedGpuMemory;
        } else {
            ((nvmlProcessInfo_v2_t *)infos)[i] = rows_buf[i];
        }
    }
    *count = n;
    return fg_leave(NVML_SUCCESS);
}

#define PROCESS_QUERY(name, v1, compute)                                          \
    NVML_API nvmlReturn_t name(nvmlDevice_t h, unsigned int *count, void *infos)  \
    {                                                                             \
        return processes(#name, h, count, infos, v1, compute);                    \
    }

PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses, 1, 1)
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v2, 0, 1)
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v3, 0, 1)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses, 1, 0)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses_v2, 0, 0)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses_v3, 0, 0)
PROCESS_QUERY(nvmlDeviceGetMPSComputeRunningProcesses, 1, 0)
PROCESS_QUERY(nvmlDeviceGetMPSComputeRunningProcesses_v2, 0, 0)
PROCESS_QUERY(nvmlDeviceGetMPSComputeRunningProcesses_v3, 0, 0)
