"""Hand-built observations (GPUs, processes, snapshots) for the pure rules and the ladder.

GPUs are NVIDIA ones: their device nodes and infrastructure names come from the NVIDIA backend,
as in a real survey.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_nvidia import NvmlBackend
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import GpuState, ProcState, Snapshot, UnitFacts
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_survey import SURVEY_ARGUMENT_SPEC

NVIDIA = NvmlBackend('/dev')
OWN_NS = 'pid:[4026531836]'


def gpu(index, minor=None, used=0, processes=()):
    minor = index if minor is None else minor
    return GpuState(index=index, uuid='GPU-%08d-0000' % index, name='NVIDIA H200',
                    pci_bus_id='00000000:%02X:00.0' % (0x10 + index),
                    minor=minor, nodes=NVIDIA.gpu_nodes(minor), total_mib=97887, used_mib=used,
                    reserved_mib=615, processes=list(processes), persistence_mode=True)


def proc(pid, name='python3', fds=(), maps=(), state='sleeping', ppid=1, cmdline=None,
         cgroup='0::/user.slice/session-1.scope', pidns=OWN_NS, nspid=None, kthread=False):
    p = ProcState(pid)
    p.start_time = 1000 + pid
    p.name = name
    p.cmdline = cmdline if cmdline is not None else name
    p.state = state
    p.ppid = ppid
    p.cgroup = cgroup
    p.pidns = pidns
    p.nspid = nspid or [pid]
    p.kthread = kthread
    p.user = 'root'
    p.uid = 0
    p.uids = (0, 0, 0, 0)
    p.exe_uid = 0          # a root process started from a root-owned executable
    p.dev_fds = set(fds)
    p.dev_maps = set(maps)
    return p


def snap(gpus, procs, missing=(), own_pid=99999):
    return Snapshot(gpus=gpus, procs=dict((p.pid, p) for p in procs), backend='nvml',
                    own_pid=own_pid, own_pidns=OWN_NS, unreadable=[], nvml_missing_pids=list(missing),
                    taken_at=0.0, infrastructure=NVIDIA.infrastructure)


CTX = ('/dev/nvidia0', '/dev/nvidiactl', '/dev/nvidia-uvm')
# The free threshold gpu_holders and gpu_reclaim use unless told otherwise (the decisions take theirs from
# their caller: the option's default is written once, in the survey's spec).
FREE_MIB = SURVEY_ARGUMENT_SPEC['free_threshold_mib']['default']


def runtime_confirms(cgroup_text, init_pid=4242):
    """The facts a container runtime gives when it confirms the container of `cgroup_text` is
    the holder's: its inspect names an init PID whose /proc/PID/cgroup is that container's
    (gpu_trust.confirm)."""
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
    owner = gpu_owner.owner_from_cgroup(cgroup_text)
    return {'runtimes': {(owner.runtime, owner.id): {'pid': init_pid, 'init_cgroup': cgroup_text}}}


def systemd_confirms(*cgroups, **kwargs):
    """System unit facts (Restart, ActiveState, ControlGroup) for units at these cgroup paths,
    as `systemctl show` answers for a loaded unit."""
    restart = kwargs.get('restart', 'no')
    return dict((path.rstrip('/').rsplit('/', 1)[-1], UnitFacts(restart, 'active', path)) for path in cgroups)


def diagnosed(snapshot, holders, unconfirmed, rows, spared_pids=frozenset(), blind_sentence=None):
    """The diagnosis sentences the Surveyor writes: gpu_decide's findings through gpu_say."""
    return say.diagnosis(decide.findings(snapshot, holders, unconfirmed, rows, spared_pids, bool(blind_sentence)),
                         blind_sentence)


# A process's /proc/PID/cgroup text as the kernel writes it, and its owner as gpu_owner reads it
# with the families' recognisers. Container ids are 64 hex digits as the runtimes make them; pod
# UIDs are RFC 4122 UUIDs.
CID = "9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b"
CID2 = "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"
POD_UID = "74c13223-5a00-11e9-b385-42010a80018d"

V1_ROOTS = "".join("%d:%s:/\n" % (i, c) for i, c in enumerate(
    ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids"), start=1))


def v2(path):
    return "0::%s\n" % path


def v1(path, controllers=("cpu,cpuacct", "memory", "pids", "devices")):
    lines = ["%d:%s:%s" % (i, c, path) for i, c in enumerate(controllers, start=2)]
    return "\n".join(["1:name=systemd:%s" % path] + lines) + "\n"


def own(text):
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
    return gpu_owner.owner_from_cgroup(text)


class _ScriptedGpus(NVIDIA.__class__):
    """The NVIDIA backend with the driver's answer given: node paths under a test directory."""

    def __init__(self, dev_dir, gpus):
        super(_ScriptedGpus, self).__init__(dev_dir)
        self.gpus = gpus

    def read_gpus(self, timeout):
        return self.gpus


# A real process holding a device node as a GPU holder does: it maps argv[1], says 'ready', waits.
_MAP_AND_WAIT = (
    "import mmap, sys\n"
    "f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096)\n"
    "print('ready', flush=True); import time; time.sleep(120)\n")
