/* Allocation registry: var/lib/fakegpu/alloc/<nonce>, one file per context, written by
 * `fakegpu hold`. A context is alive while its creator's OFD lock on the device file is
 * held; OFD locks live as long as any fd sharing the open file description, so a forked
 * child that inherited the fd keeps its dead parent's memory, like a real CUDA context. */
#ifndef FG_ALLOC_H
#define FG_ALLOC_H

struct fg_alloc {
    unsigned minor;
    unsigned pid;                   /* creator, in the creator's PID namespace */
    unsigned long long pidns;       /* inode of the creator's /proc/self/ns/pid */
    unsigned long long mib;
    int peer;                       /* peer memory (NCCL/IPC): used, charged to no process */
};

/* Allocations that still hold memory (alive, or dead for less than lag_ms).
 * Returns how many there are (may exceed max; only max are copied), -1 on error. */
int fg_alloc_collect(long long lag_ms, struct fg_alloc *out, int max);

/* Inode of this process's PID namespace (0 if unknown). */
unsigned long long fg_self_pidns(void);

#endif
