/* Library-wide state shared by the nvml_*.c entry points, behind one lock. */
#ifndef FG_STATE_H
#define FG_STATE_H

#include "fg_config.h"
#include "nvml_abi.h"

extern struct fg_config fg_cfg;
extern unsigned long long fg_pidns;     /* caller's PID namespace, read at nvmlInit */

/* Every entry point starts with enter() and returns through leave().
 * enter() applies the hang knob, takes the lock, refreshes the config and, when
 * need_init, refuses with NVML_ERROR_UNINITIALIZED before nvmlInit. */
nvmlReturn_t fg_enter(const char *fn, int need_init);
nvmlReturn_t fg_leave(nvmlReturn_t rc);
int fg_initialized(void);
void fg_set_initialized(int refcount_delta);

/* NVML's string-out convention: INVALID_ARGUMENT for no buffer, INSUFFICIENT_SIZE when
 * src and its NUL do not fit in size bytes. */
nvmlReturn_t fg_copy_str(char *dst, unsigned int size, const char *src);

/* Handle <-> GPU; NULL when the handle is not one of ours or the GPU is gone. */
nvmlDevice_t fg_handle_for(unsigned index);
const struct fg_gpu *fg_gpu_of(nvmlDevice_t handle);

/* fn is the exported name, which the hang knob matches against. */
#define FG_ENTER_AS(fn, need_init)                          \
    do {                                                    \
        nvmlReturn_t enter_rc_ = fg_enter(fn, need_init);   \
        if (enter_rc_ != NVML_SUCCESS)                      \
            return enter_rc_;                               \
    } while (0)
#define FG_ENTER(need_init) FG_ENTER_AS(__func__, need_init)

#endif
