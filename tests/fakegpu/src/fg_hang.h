/* The "hanging NVML" knob: configured calls sleep before doing anything, so that callers'
 * timeouts can be tested. The sleep is interruptible (state S), unlike a real D-state hang. */
#ifndef FG_HANG_H
#define FG_HANG_H

#include "fg_config.h"

/* Seconds the call named `fn` must hang under this config (0: it does not hang). */
double fg_hang_seconds(const struct fg_config *cfg, const char *fn);
void fg_sleep(double seconds);

#endif
