/* Device files the library holds open while initialised, as the real NVML does
 * (an NVML-only process shows /dev/nvidiaN, nvidiactl, nvidia-uvm open, nothing mapped). */
#ifndef FG_DEV_H
#define FG_DEV_H

#include "fg_config.h"

/* Opens nvidiactl, nvidia-uvm and every dev/nvidia<minor>; 0 or -1 (nothing left open). */
int fg_dev_open_all(const struct fg_config *cfg);
void fg_dev_close_all(void);
/* An fd on dev/nvidia<minor>, opened now if the config gained a GPU; -1 if missing. */
int fg_dev_fd(unsigned minor);

#endif
