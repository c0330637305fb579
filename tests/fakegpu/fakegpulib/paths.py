"""Where the stand-in keeps its files under $FAKEGPU_ROOT (default /)."""
import os


def root():
    return os.environ.get("FAKEGPU_ROOT") or "/"


def under_root(rel):
    return os.path.join(root(), rel.lstrip("/"))


def config_path():
    return under_root("etc/fakegpu/config.json")


def state_dir():
    return under_root("var/lib/fakegpu")


def alloc_dir():
    return under_root("var/lib/fakegpu/alloc")


def dead_dir():
    return under_root("var/lib/fakegpu/dead")


def dev_path(name):
    """name: 'nvidiactl', 'nvidia-uvm' or 'nvidia<minor>'."""
    return under_root("dev/" + name)


def gpu_dev_path(minor):
    return dev_path("nvidia%d" % minor)
