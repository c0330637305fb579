#include "fg_dev.h"

#include <fcntl.h>
#include <unistd.h>

#define FG_MAX_MINOR 256

static int minor_fd[FG_MAX_MINOR];
static int ctl_fd = -1, uvm_fd = -1;
static int opened;

static int open_rel(const char *rel_fmt, unsigned minor)
{
    char path[4096];
    if (fg_path(path, sizeof(path), rel_fmt, minor))
        return -1;
    /* O_CLOEXEC: children such as nvidia-smi must not inherit our handles. */
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd;
}

int fg_dev_open_all(const struct fg_config *cfg)
{
    if (!opened) {
        for (int i = 0; i < FG_MAX_MINOR; i++)
            minor_fd[i] = -1;
        opened = 1;
    }
    ctl_fd = open_rel("dev/nvidiactl", 0);
    uvm_fd = open_rel("dev/nvidia-uvm", 0);
    if (ctl_fd < 0)
        goto fail;
    for (unsigned i = 0; i < cfg->count; i++)
        if (fg_dev_fd(cfg->gpus[i].minor) < 0)
            goto fail;
    return 0;
fail:
    fg_dev_close_all();
    return -1;
}

void fg_dev_close_all(void)
{
    if (ctl_fd >= 0) close(ctl_fd);
    if (uvm_fd >= 0) close(uvm_fd);
    ctl_fd = uvm_fd = -1;
    for (int i = 0; opened && i < FG_MAX_MINOR; i++) {
        if (minor_fd[i] >= 0)
            close(minor_fd[i]);
        minor_fd[i] = -1;
    }
}

int fg_dev_fd(unsigned minor)
{
    if (minor >= FG_MAX_MINOR)
        return -1;
    if (minor_fd[minor] < 0)
        minor_fd[minor] = open_rel("dev/nvidia%u", minor);
    return minor_fd[minor];
}
