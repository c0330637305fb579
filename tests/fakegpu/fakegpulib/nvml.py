"""A small ctypes client of the stand-in libnvidia-ml.so.1, so that `fakegpu status`
and `nvidia-smi` report exactly what NVML reports (one implementation of the truth)."""
import ctypes
import os

MIB = 1 << 20
NVML_ERROR_INSUFFICIENT_SIZE = 7
MEMORY_V2 = 40 | (2 << 24)


class NvmlError(Exception):
    def __init__(self, fn, code, text):
        super().__init__("%s failed: %s (%d)" % (fn, text, code))
        self.code = code


class _Memory2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _Memory1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _Pci(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


def library_path():
    """$FAKEGPU_LIB, else the build next to this checkout, else the system library."""
    env = os.environ.get("FAKEGPU_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    built = os.path.join(here, "build", "libnvidia-ml.so.1")
    return built if os.path.exists(built) else "libnvidia-ml.so.1"


class Nvml:
    def __init__(self):
        self.lib = ctypes.CDLL(library_path())
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._call("nvmlInit_v2")

    def close(self):
        self._call("nvmlShutdown")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, fn, *args, ok=(0,)):
        rc = getattr(self.lib, fn)(*args)
        if rc not in ok:
            raise NvmlError(fn, rc, self.lib.nvmlErrorString(rc).decode())
        return rc

    def count(self):
        n = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(n))
        return n.value

    def handle(self, index):
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
        return h

    def _text(self, fn, h):
        buf = ctypes.create_string_buffer(96)
        self._call(fn, h, buf, ctypes.c_uint(96))
        return buf.value.decode()

    def gpu(self, index):
        """Everything nvidia-smi and `fakegpu status` show about one GPU (MiB, ints)."""
        h = self.handle(index)
        pci = _Pci()
        self._call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci))
        mem2 = _Memory2(version=MEMORY_V2)
        self._call("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(mem2))
        mem1 = _Memory1()
        self._call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem1))
        minor, pm = ctypes.c_uint(), ctypes.c_int()
        self._call("nvmlDeviceGetMinorNumber", h, ctypes.byref(minor))
        self._call("nvmlDeviceGetPersistenceMode", h, ctypes.byref(pm))
        return {
            "index": index,
            "minor": minor.value,
            "uuid": self._text("nvmlDeviceGetUUID", h),
            "name": self._text("nvmlDeviceGetName", h),
            "pci_bus_id": pci.busId.decode(),
            "memory_total_mib": mem2.total // MIB,
            "memory_reserved_mib": mem2.reserved // MIB,
            "memory_used_mib": mem2.used // MIB,          # excludes reserved, as nvidia-smi
            "memory_free_mib": mem2.free // MIB,
            "memory_used_v1_mib": mem1.used // MIB,       # includes reserved, as NVML v1
            "persistence_mode": pm.value,
            "processes": self.processes(h),
        }

    def processes(self, h):
        # Asked again while contexts appear faster than the list grows between the two calls
        # (24 holders starting at once: bench/run reclaim --shape ranks), as NVML's callers must.
        for _attempt in range(16):
            count = ctypes.c_uint(0)
            rc = self._call("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(count),
                            None, ok=(0, NVML_ERROR_INSUFFICIENT_SIZE))
            if rc == 0:
                return []
            count.value = count.value * 2 + 5
            rows = (_Proc * count.value)()
            rc = self._call("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(count), rows,
                            ok=(0, NVML_ERROR_INSUFFICIENT_SIZE))
            if rc == 0:
                return [{"pid": r.pid, "used_mib": r.usedGpuMemory // MIB} for r in rows[:count.value]]
        raise NvmlError("nvmlDeviceGetComputeRunningProcesses_v3", rc, self.lib.nvmlErrorString(rc).decode())

    def set_persistence(self, index, mode):
        self._call("nvmlDeviceSetPersistenceMode", self.handle(index), ctypes.c_int(mode))
