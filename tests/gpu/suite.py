"""The collection's scenarios against real NVIDIA GPUs, through Ansible as a user runs it.

Run it through tests/gpu/run (which installs the carried wheels first). It writes
gpu_report.json and gpu_report.txt under --out, always, and exits 0 (PASS) when every scenario
ran and passed, 3 (PARTIAL) when every one that ran passed but one was skipped or left out, 1
(FAIL) when one failed, 2 when the machine cannot run the suite at all (see `verdict`).

Rules it keeps: it never resets or reconfigures a GPU (reset only in check mode); it signals only
processes it started (each carries GPURT_RUN=<run id> in its environment and the run id in its
command line, and the modules get `match: [<run id>]`, except one scenario, s11, that runs only
when every process holding a GPU context is the run's own); this runner never creates a CUDA context
itself (it reads the driver through pynvml only), so it holds no GPU memory.
"""
import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(HERE, 'workload.py')
MIB = 1 << 20
SMI_QUERY = ['nvidia-smi', '--query-gpu=index,uuid,memory.used,memory.total',
             '--format=csv,noheader,nounits']

try:
    import pynvml
    PYNVML_ERROR = None
except ImportError as _exc:
    pynvml = None
    PYNVML_ERROR = str(_exc)


class StepError(Exception):
    """A step could not be done (a process did not start, a tool did not answer)."""


class Skip(Exception):
    """The machine lacks what a scenario needs (NCCL, unshare): the scenario is skipped, saying why."""


class TimeUp(BaseException):
    """The scenario's or the suite's time ran out (raised from a timer signal)."""


class Terminated(BaseException):
    """SIGTERM (tests/gpu/run's last-resort timeout): stop, clean up, write the report."""


def _time_up(signum, _frame):
    raise TimeUp('time limit reached (signal %d)' % signum)


def _terminated(signum, _frame):
    raise Terminated('terminated by signal %d' % signum)


class time_limit(object):
    """Raise TimeUp in the main thread after `seconds` (setitimer); nests by taking the minimum."""

    def __init__(self, seconds):
        self.seconds = max(0.5, seconds)

    def __enter__(self):
        self.prev_handler = signal.signal(signal.SIGALRM, _time_up)
        self.prev = signal.getitimer(signal.ITIMER_REAL)[0]
        self.started = time.monotonic()
        limit = self.seconds if not self.prev else min(self.seconds, self.prev)
        signal.setitimer(signal.ITIMER_REAL, limit)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self.prev:
            left = self.prev - (time.monotonic() - self.started)
            signal.setitimer(signal.ITIMER_REAL, max(0.01, left))
        signal.signal(signal.SIGALRM, self.prev_handler)
        return False


def run_cmd(argv, timeout, env=None):
    """(rc, stdout, stderr, wall_s); rc 124 on timeout, 127 when the program is missing."""
    started = time.monotonic()
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                             env=env, stdin=subprocess.DEVNULL, universal_newlines=True, check=False)
        return out.returncode, out.stdout, out.stderr, round(time.monotonic() - started, 3)
    except subprocess.TimeoutExpired as exc:
        return 124, _s(exc.stdout), _s(exc.stderr) + '\n(timed out after %ss)' % timeout, \
            round(time.monotonic() - started, 3)
    except OSError as exc:
        return 127, '', str(exc), round(time.monotonic() - started, 3)


def _s(value):
    if value is None:
        return ''
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else value


def tail(text, n=3000):
    text = text or ''
    return text if len(text) <= n else '...' + text[-n:]


def wait_for(predicate, timeout, interval=0.05):
    """Poll until predicate() is truthy; (value, waited_s)."""
    started = time.monotonic()
    while True:
        value = predicate()
        waited = time.monotonic() - started
        if value or waited >= timeout:
            return value, round(waited, 3)
        time.sleep(interval)


# --- the driver, read directly ----------------------------------------------------------------------

class Nvml(object):
    """pynvml session; the runner keeps it open only while it measures."""

    def __enter__(self):
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                        for i in range(pynvml.nvmlDeviceGetCount())]
        return self

    def __exit__(self, *exc):
        try:
            pynvml.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass
        return False

    def used_bytes(self, index):
        handle = self.handles[index]
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used
        except Exception:  # pylint: disable=broad-except
            return pynvml.nvmlDeviceGetMemoryInfo(handle).used

    def procs(self, index):
        out = {}
        for entry in pynvml.nvmlDeviceGetComputeRunningProcesses(self.handles[index]):
            used = entry.usedGpuMemory
            out[int(entry.pid)] = None if used is None or used >= (1 << 63) else used // MIB
        return out

    def gpu(self, index):
        handle = self.handles[index]
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            reserved = mem.reserved // MIB
        except Exception:  # pylint: disable=broad-except
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        return {'index': index, 'uuid': _s(uuid), 'name': _s(pynvml.nvmlDeviceGetName(handle)),
                'minor': int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                'used_mib': mem.used // MIB, 'reserved_mib': reserved, 'total_mib': mem.total // MIB,
                'free_mib': mem.free // MIB, 'procs': self.procs(index)}

    def all(self):
        return [self.gpu(i) for i in range(len(self.handles))]


def nvml_read():
    with Nvml() as nv:
        return nv.all()


def smi_table():
    rc, out, err, _unused = run_cmd(SMI_QUERY, 30)
    if rc != 0:
        raise StepError('nvidia-smi failed (rc=%d): %s' % (rc, tail(err or out, 500)))
    rows = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(',')]
        if len(parts) >= 4 and parts[0].isdigit():
            rows[int(parts[0])] = {'uuid': parts[1], 'used_mib': int(parts[2]), 'total_mib': int(parts[3])}
    return rows


# --- /proc --------------------------------------------------------------------------------------------

def proc_identity(pid):
    """(state letter, ppid, comm) or None when gone."""
    try:
        with open('/proc/%d/stat' % pid) as handle:
            text = handle.read()
    except (IOError, OSError):
        return None
    comm = text[text.index('(') + 1:text.rindex(')')]
    fields = text[text.rindex(')') + 2:].split()
    return fields[0], int(fields[1]), comm


def alive(pid):
    ident = proc_identity(pid)
    return ident is not None and ident[0] not in ('Z', 'X')


def comm_of(pid):
    ident = proc_identity(pid)
    return ident[2] if ident else None


def nvidia_nodes(pid):
    """Device nodes under /dev/nvidia* that PID has open (fd) and mapped (maps)."""
    fds, maps = set(), set()
    try:
        for name in os.listdir('/proc/%d/fd' % pid):
            try:
                target = os.readlink('/proc/%d/fd/%s' % (pid, name))
            except OSError:
                continue
            if target.startswith('/dev/nvidia'):
                fds.add(target)
    except OSError:
        pass
    try:
        with open('/proc/%d/maps' % pid) as handle:
            for line in handle:
                idx = line.find(' /dev/nvidia')
                if idx >= 0:
                    maps.add(line[idx + 1:].strip())
    except (IOError, OSError):
        pass
    return {'fd': sorted(fds), 'mmap': sorted(maps)}


# --- the suite ------------------------------------------------------------------------------------------

class Suite(object):
    def __init__(self, out, budget, backend, python):
        self.out = out
        self.budget = budget
        self.backend = backend
        self.python = python                      # module interpreter and workload python
        self.started = time.monotonic()
        self.run_id = 'gpurt-' + secrets.token_hex(4)
        self.work = tempfile.mkdtemp(prefix=self.run_id + '-')
        self.popens = []
        self.counter = 0
        self.ngpus = 0
        self.test_gpus = []
        self.baseline = {}
        self.minor = {}
        self.release_ms_s1 = None
        self.report = {
            'suite': 'gpuops.reclaim real-GPU suite (tests/gpu)',
            'run_id': self.run_id,
            'started_at': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
            'preflight': {},
            'scenarios': [],
        }

    # -- time --
    def left(self):
        return self.budget - (time.monotonic() - self.started)

    # -- processes this suite starts --
    def env(self):
        env = dict(os.environ)
        env['GPURT_RUN'] = self.run_id
        env.setdefault('CUDA_DEVICE_ORDER', 'PCI_BUS_ID')   # torch's cuda:N == NVML index N
        env.setdefault('PYTHONUNBUFFERED', '1')
        return env

    def start(self, kind, args, label, prefix=()):
        """Start a workload (behind `prefix`, e.g. unshare); returns (popen, ready_path, log_path)."""
        self.counter += 1
        ready = os.path.join(self.work, 'ready-%02d-%s.json' % (self.counter, label))
        log = os.path.join(self.work, 'log-%02d-%s.txt' % (self.counter, label))
        max_life = max(30.0, self.left() + 30.0)
        argv = list(prefix) + [self.python, WORKLOAD, kind, '--ready', ready, '--max-life', '%.0f' % max_life,
                               '--backend', self.backend, '--marker', self.run_id] + list(args)
        with open(log, 'w') as handle:
            proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env(), cwd=self.work)
        self.popens.append(proc)
        return proc, ready, log

    def wait_ready(self, started, timeout=150):
        proc, ready, log = started
        limit = min(timeout, max(5.0, self.left()))
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if os.path.exists(ready):
                with open(ready) as handle:
                    return json.load(handle)
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        with open(log) as handle:
            text = handle.read()
        if proc.poll() is not None:
            raise StepError('workload %s exited with %s before it was ready; its log:\n%s'
                            % (os.path.basename(ready), proc.returncode, tail(text)))
        raise StepError('workload %s not ready after %.0f s; its log:\n%s'
                        % (os.path.basename(ready), limit, tail(text)))

    def ours(self):
        """PIDs of every live process this run started (GPURT_RUN=<run id> in its environment)."""
        needle = ('GPURT_RUN=%s' % self.run_id).encode()
        found = []
        for name in os.listdir('/proc'):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open('/proc/%s/environ' % name, 'rb') as handle:
                    if needle in handle.read().split(b'\0'):
                        found.append(int(name))
            except (IOError, OSError):
                continue
        return [pid for pid in found if alive(pid)]

    def reap(self):
        for proc in self.popens:
            proc.poll()

    def kill_ours(self, timeout=10.0):
        """SIGKILL every live process of this run, and wait until they are gone."""
        killed = []
        for _unused in range(5):
            pids = self.ours()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            wait_for(lambda: (self.reap(), not [p for p in pids if alive(p)])[1], timeout / 5)
        self.reap()
        return sorted(set(killed)), self.ours()

    def wait_baseline(self, gpus, timeout=15.0, slack_mib=64):
        """Wait until the GPUs' used memory is back to the suite's baseline; (ok, waited, used)."""
        state = {}

        def back():
            with Nvml() as nv:
                for gpu in gpus:
                    state[gpu] = nv.used_bytes(gpu) // MIB
            return all(state[g] <= self.baseline[g] + slack_mib for g in gpus)
        ok, waited = wait_for(back, timeout, 0.05)
        return ok, waited, dict(state)

    # -- ansible as a user runs it --
    def setup_ansible(self):
        coll = os.path.join(self.work, 'collections', 'ansible_collections', 'gpuops')
        os.makedirs(coll)
        os.symlink(REPO, os.path.join(coll, 'reclaim'))
        self.ansible_cfg = os.path.join(self.work, 'ansible.cfg')
        with open(self.ansible_cfg, 'w') as handle:
            handle.write('[defaults]\nstdout_callback = minimal\ncallback_result_format = json\n'
                         'host_key_checking = False\nretry_files_enabled = False\n'
                         'interpreter_python = %s\nlocal_tmp = %s\nremote_tmp = %s\n'
                         'deprecation_warnings = False\nnocolor = True\n'
                         % (self.python, os.path.join(self.work, 'ans-local'),
                            os.path.join(self.work, 'ans-remote')))

    def ansible_env(self):
        env = dict(os.environ)
        env.pop('GPURT_RUN', None)
        env.update({
            'ANSIBLE_CONFIG': self.ansible_cfg,
            'ANSIBLE_COLLECTIONS_PATH': os.path.join(self.work, 'collections'),
            'ANSIBLE_HOME': os.path.join(self.work, 'ansible-home'),
            'ANSIBLE_NOCOLOR': '1',
            'LC_ALL': env.get('LC_ALL') or 'C.UTF-8',
            'LANG': env.get('LANG') or 'C.UTF-8',
        })
        return env

    def ansible(self, module, args, check=False, timeout=150):
        """Run `ansible localhost -m gpuops.reclaim.MODULE -a JSON`; the module's result as a dict."""
        self.counter += 1
        tree = os.path.join(self.work, 'tree-%02d' % self.counter)
        argv = [self.python, '-m', 'ansible', 'adhoc', 'localhost', '-i', 'localhost,', '-c', 'local',
                '-m', 'gpuops.reclaim.' + module, '-t', tree,
                '-e', 'ansible_python_interpreter=%s' % self.python]
        if args:   # an empty `-a '{}'` reads as raw params, which these modules refuse
            argv += ['-a', json.dumps(args)]
        if check:
            argv.append('--check')
        limit = min(timeout, max(10.0, self.left()))
        rc, out, err, wall = run_cmd(argv, limit, env=self.ansible_env())
        result = None
        path = os.path.join(tree, 'localhost')
        if os.path.exists(path):
            with open(path) as handle:
                try:
                    result = json.load(handle)
                except ValueError:
                    result = None
        if result is None and ' => ' in out:
            try:
                result = json.loads(out.split(' => ', 1)[1])
            except ValueError:
                result = None
        call = {'module': module, 'args': args, 'check_mode': check, 'rc': rc, 'wall_s': wall,
                'command': ' '.join(argv[:2] + ["'%s'" % a if ' ' in a or '{' in a else a
                                                for a in argv[2:]])}
        if result is None:
            call['stdout'] = tail(out)
            call['stderr'] = tail(err)
            raise StepError('ansible %s gave no result (rc=%d):\n%s\n%s' % (module, rc, tail(out, 1500),
                                                                            tail(err, 1500)))
        if err.strip():
            call['stderr'] = tail(err, 1500)
        if 'failed' not in result:
            # The tree callback leaves `failed` out; for one host, ansible's rc says it (2: failed).
            result['failed'] = rc != 0
            call['failed_inferred_from_rc'] = True
        return call, result

    # -- the run --
    def preflight(self):
        pre = self.report['preflight']
        pre['host'] = platform.node()
        pre['kernel'] = platform.release()
        pre['python'] = sys.version.split()[0]
        pre['python_executable'] = self.python
        pre['euid'] = os.geteuid()
        pre['pid1_comm'] = comm_of(1)
        pre['cuda_visible_devices'] = os.environ.get('CUDA_VISIBLE_DEVICES')
        pre['pythonpath'] = os.environ.get('PYTHONPATH')
        pre['tools'] = dict((t, shutil.which(t)) for t in ('nvidia-smi', 'fuser', 'lsof', 'systemctl'))
        fatal = []
        rc, out, err, wall = run_cmd(['nvidia-smi', '-L'], 30)
        pre['nvidia_smi_L'] = {'rc': rc, 'out': tail(out or err, 2000), 'wall_s': wall}
        query = ('--query-gpu=index,name,driver_version,memory.used,memory.total,persistence_mode,'
                 'mig.mode.current')
        rc, out, err, _unused = run_cmd(['nvidia-smi', query, '--format=csv,noheader'], 30)
        pre['nvidia_smi_query'] = tail(out or err, 2000)
        if self.backend == 'torch':
            rc, out, err, wall = run_cmd(
                [self.python, '-c', 'import json, torch; print(json.dumps({"torch": torch.__version__, '
                 '"cuda": torch.version.cuda, "available": torch.cuda.is_available(), '
                 '"device_count": torch.cuda.device_count()}))'], 150, env=self.env())
            try:
                pre['torch'] = json.loads(out.strip().splitlines()[-1])
                pre['torch']['probe_wall_s'] = wall
            except (ValueError, IndexError):
                pre['torch'] = {'error': tail(err or out, 2000), 'rc': rc}
                fatal.append('torch cannot be imported by %s' % self.python)
        if pynvml is None:
            pre['pynvml'] = {'error': PYNVML_ERROR}
            fatal.append('pynvml (nvidia-ml-py) cannot be imported: were the wheels installed?')
        else:
            info = {'file': pynvml.__file__}
            try:
                from importlib.metadata import version  # pylint: disable=import-outside-toplevel
                info['nvidia_ml_py'] = version('nvidia-ml-py')
            except Exception:  # pylint: disable=broad-except
                info['nvidia_ml_py'] = None
            try:
                started = time.monotonic()
                with Nvml() as nv:
                    info['driver'] = _s(pynvml.nvmlSystemGetDriverVersion())
                    gpus = nv.all()
                info['init_query_ms'] = round((time.monotonic() - started) * 1000, 1)
                info['gpus'] = [dict(g, procs=dict((str(k), v) for k, v in g['procs'].items()))
                                for g in gpus]
                self.ngpus = len(gpus)
                pre['cards'] = cards_line(gpus)
                self.baseline = dict((g['index'], g['used_mib']) for g in gpus)
                self.minor = dict((g['index'], g['minor']) for g in gpus)
                foreign = sorted(set(p for g in gpus for p in g['procs']))
                pre['foreign_gpu_processes_at_start'] = foreign
            except Exception as exc:  # pylint: disable=broad-except
                info['error'] = repr(exc)
                fatal.append('NVML does not answer: %r' % exc)
            pre['pynvml'] = info
        torch_count = pre.get('torch', {}).get('device_count', self.ngpus)
        usable = min(self.ngpus, torch_count if isinstance(torch_count, int) else 0)
        if usable < 1 and not fatal:
            fatal.append('no GPU usable by both NVML (%d) and torch (%s)' % (self.ngpus, torch_count))
        self.test_gpus = list(range(min(usable, 2)))
        pre['test_gpus'] = self.test_gpus
        pre['baseline_used_mib'] = dict((str(k), v) for k, v in self.baseline.items())
        rc, out, err, wall = run_cmd([self.python, '-m', 'ansible', 'adhoc', '--version'], 90,
                                     env=self.ansible_env())
        pre['ansible'] = {'rc': rc, 'version': tail(out or err, 800), 'wall_s': wall}
        self.has_ansible = rc == 0
        pre['fatal'] = fatal
        return not fatal

    def scenario(self, name, title, fn, limit, needs_ansible=True, needs_gpus=1):
        entry = {'name': name, 'title': title, 'status': 'pass', 'checks': [], 'numbers': {},
                 'notes': [], 'ansible_calls': []}
        self.report['scenarios'].append(entry)
        if len(self.test_gpus) < needs_gpus:
            skip(entry, 'needs %d GPUs, %d usable' % (needs_gpus, len(self.test_gpus)))
            return
        if needs_ansible and not self.has_ansible:
            entry['status'] = 'error'
            entry['error'] = 'ansible-core cannot run here (see preflight.ansible)'
            return
        if self.left() < 20:
            skip(entry, 'suite time budget spent (%.0f s left)' % self.left())
            return
        started = time.monotonic()
        ctx = Ctx(self, entry)
        try:
            with time_limit(min(limit, self.left() - 10)):
                fn(ctx)
        except Skip as exc:
            skip(entry, str(exc))
        except TimeUp as exc:
            entry['status'] = 'error'
            entry['error'] = 'scenario ran out of time: %s' % exc
            entry['traceback'] = traceback.format_exc()
        except Exception as exc:  # pylint: disable=broad-except
            entry['status'] = 'error'
            entry['error'] = '%s: %s' % (type(exc).__name__, exc)
            entry['traceback'] = traceback.format_exc()
        finally:
            try:
                killed, left = self.kill_ours()
                entry['cleanup'] = {'killed': killed, 'left_alive': left}
                if self.test_gpus:
                    ok, waited, used = self.wait_baseline(self.test_gpus, timeout=15)
                    entry['cleanup'].update({'gpus_back_to_baseline': ok, 'waited_s': waited,
                                             'used_mib': dict((str(k), v) for k, v in used.items())})
                    if not ok:
                        entry['notes'].append('after cleanup the GPUs were not back to the baseline')
            except BaseException as exc:  # pylint: disable=broad-except
                entry['cleanup'] = {'error': repr(exc)}
        if entry['status'] == 'pass' and any(not c['ok'] and c['hard'] for c in entry['checks']):
            entry['status'] = 'fail'
        entry['duration_s'] = round(time.monotonic() - started, 3)

    def close(self):
        try:
            killed, left = self.kill_ours()
            self.report['final_cleanup'] = {'killed': killed, 'left_alive': left}
        except BaseException as exc:  # pylint: disable=broad-except
            self.report['final_cleanup'] = {'error': repr(exc)}
        shutil.rmtree(self.work, ignore_errors=True)


def cards_line(gpus):
    """The cards the suite runs on, named with their memory: 'NVIDIA H100 80GB HBM3 x2, 81559 MiB
    each (free: 0: 80944, 1: 80944)'; different cards are listed one by one."""
    if not gpus:
        return 'no GPU'
    kinds = sorted(set((g['name'], g['total_mib']) for g in gpus))
    free = ', '.join('%d: %d' % (g['index'], g['free_mib']) for g in gpus)
    if len(kinds) == 1:
        return '%s x%d, %d MiB each (free MiB at the start: %s)' % (kinds[0][0], len(gpus), kinds[0][1], free)
    return '%s (free MiB at the start: %s)' % (
        '; '.join('%d: %s, %d MiB' % (g['index'], g['name'], g['total_mib']) for g in gpus), free)


def skip(entry, why):
    """Mark a scenario skipped, saying why (the report's PARTIAL line names it with this)."""
    entry['status'] = 'skip'
    entry['skip_reason'] = why
    entry['notes'].append('skipped: %s' % why)


def verdict(scenarios, not_selected=(), broke=False):
    """The report's (result, summary, exit code) from the scenarios' entries.

    FAIL (exit 1): a scenario failed or broke, or the suite itself broke. PARTIAL (exit 3):
    every scenario that ran passed, but one was skipped or left out by --only (or none ran);
    the summary names each with why. PASS (exit 0): every scenario ran and passed.
    """
    summary = ', '.join('%s=%s' % (s['name'], s['status']) for s in scenarios)
    if broke or any(s['status'] not in ('pass', 'skip') for s in scenarios):
        return 'FAIL', summary, 1
    missing = ['%s (%s)' % (s['name'], s.get('skip_reason') or 'skipped') for s in scenarios if s['status'] == 'skip']
    missing += ['%s (not in --only)' % name for name in not_selected]
    if missing or not scenarios:
        return 'PARTIAL', '%s; did not run: %s' % (summary, ', '.join(missing) or 'any scenario'), 3
    return 'PASS', summary, 0


class Ctx(object):
    """What a scenario function gets: the suite, and places to put checks and numbers."""

    def __init__(self, suite, entry):
        self.suite = suite
        self.entry = entry

    def check(self, what, ok, detail=None, hard=True):
        self.entry['checks'].append({'what': what, 'ok': bool(ok), 'hard': hard,
                                     'detail': detail})
        return bool(ok)

    def num(self, key, value):
        self.entry['numbers'][key] = value

    def note(self, text):
        self.entry['notes'].append(text)

    def ansible(self, module, args, check=False, timeout=150):
        call, result = self.suite.ansible(module, args, check=check, timeout=timeout)
        call['result'] = result
        self.entry['ansible_calls'].append(call)
        return call, result


# --- report ----------------------------------------------------------------------------------------------

def write_report(report, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'gpu_report.json'), 'w') as handle:
        json.dump(report, handle, indent=2, sort_keys=False, default=str)
    with open(os.path.join(out, 'gpu_report.txt'), 'w') as handle:
        handle.write(render_text(report))


def _short(value, n=300):
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= n else text[:n] + '...'


def render_text(report):
    lines = ['%s  run %s  started %s' % (report['suite'], report['run_id'], report['started_at']),
             'RESULT: %s  %s' % (report.get('result', '?'), report.get('summary', ''))]
    pre = report.get('preflight', {})
    lines += ['CARDS: %s' % pre.get('cards', 'not read (see PREFLIGHT)'), '']
    lines.append('PREFLIGHT')
    for key in ('host', 'kernel', 'python', 'python_executable', 'euid', 'pid1_comm',
                'cuda_visible_devices', 'test_gpus', 'baseline_used_mib',
                'foreign_gpu_processes_at_start', 'fatal'):
        if key in pre:
            lines.append('  %-32s %s' % (key, _short(pre[key])))
    if 'nvidia_smi_query' in pre:
        lines.append('  nvidia-smi:')
        lines.extend('    ' + l for l in pre['nvidia_smi_query'].splitlines())
    for key in ('torch', 'pynvml', 'ansible', 'tools'):
        if key in pre:
            value = dict(pre[key]) if isinstance(pre[key], dict) else pre[key]
            if isinstance(value, dict):
                value.pop('gpus', None)
            lines.append('  %-32s %s' % (key, _short(value, 400)))
    lines.append('')
    for sc in report.get('scenarios', []):
        lines.append('[%s] %s: %s  (%ss)'
                     % (sc['status'].upper(), sc['name'], sc['title'], sc.get('duration_s', '-')))
        for key, value in sc['numbers'].items():
            lines.append('    %-38s %s' % (key, _short(value, 400)))
        for c in sc['checks']:
            mark = 'ok  ' if c['ok'] else ('FAIL' if c['hard'] else 'warn')
            detail = '' if c['detail'] is None else ' -- ' + _short(c['detail'], 400)
            lines.append('    %s %s%s' % (mark, c['what'], detail))
        for call in sc.get('ansible_calls', []):
            res = call.get('result') or {}
            lines.append('    ansible: %s%s rc=%s wall=%ss changed=%s failed=%s%s' % (
                call['module'], ' (check)' if call['check_mode'] else '', call['rc'], call['wall_s'],
                res.get('changed'), res.get('failed', False),
                (' msg=' + _short(res['msg'], 300)) if res.get('msg') else ''))
            for act in res.get('actions', []) or []:
                lines.append('      %7.3fs %-12s %s %s' % (act.get('at_s', 0), act.get('step'),
                                                           act.get('pid', act.get('gpu', '')),
                                                           act.get('result')))
            for sentence in res.get('diagnosis', []) or []:
                lines.append('      diagnosis: ' + sentence)
        for note in sc.get('notes', []):
            lines.append('    note: ' + note)
        if sc.get('error'):
            lines.append('    ERROR: ' + sc['error'])
        if sc.get('traceback'):
            lines.extend('      ' + l for l in sc['traceback'].rstrip().splitlines()[-12:])
        if sc.get('cleanup'):
            lines.append('    cleanup: ' + _short(sc['cleanup'], 300))
        lines.append('')
    if 'final_cleanup' in report:
        lines.append('final cleanup: ' + _short(report['final_cleanup']))
    lines.append('total: %ss' % report.get('elapsed_s', '?'))
    return '\n'.join(lines) + '\n'


# --- main ----------------------------------------------------------------------------------------------

def main(argv=None):
    from scenarios import SCENARIOS  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--out', default=os.environ.get('OUT') or os.path.join(REPO, 'gpu-report'))
    parser.add_argument('--budget', type=float, default=float(os.environ.get('GPU_SUITE_BUDGET', 420)),
                        help='seconds for the whole suite (default 420)')
    parser.add_argument('--only', default='', help='comma-separated scenario names (s1,s3,...)')
    parser.add_argument('--backend', choices=('torch', 'fake'), default='torch',
                        help='fake: the stand-in driver, to check the plumbing without a GPU')
    parser.add_argument('--python', default=sys.executable,
                        help='python with torch; also the modules\' ansible_python_interpreter')
    args = parser.parse_args(argv)

    suite = Suite(args.out, args.budget, args.backend, args.python)
    signal.signal(signal.SIGTERM, _terminated)
    report = suite.report
    exit_code = 0
    names = [row[0] for row in SCENARIOS]
    wanted = set(x.strip() for x in args.only.split(',') if x.strip())
    not_selected = [name for name in names if wanted and name not in wanted]
    try:
        suite.setup_ansible()
        if wanted - set(names):
            report['result'] = 'CANNOT RUN'
            report['summary'] = '--only names no such scenario: %s (there are %s)' % (
                ', '.join(sorted(wanted - set(names))), ', '.join(names))
            exit_code = 2
        elif not suite.preflight():
            report['result'] = 'CANNOT RUN'
            report['summary'] = '; '.join(report['preflight']['fatal'])
            exit_code = 2
        else:
            for name, title, fn, limit, needs_ansible, needs_gpus in SCENARIOS:
                if wanted and name not in wanted:
                    continue
                suite.scenario(name, title, fn, limit, needs_ansible, needs_gpus)
    except BaseException as exc:  # pylint: disable=broad-except
        report['fatal_error'] = '%s: %s' % (type(exc).__name__, exc)
        report['traceback'] = traceback.format_exc()
        exit_code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        suite.close()
        if 'result' not in report:
            report['result'], report['summary'], exit_code = verdict(
                report['scenarios'], not_selected, broke=exit_code != 0)
        report['elapsed_s'] = round(time.monotonic() - suite.started, 3)
        report['exit_code'] = exit_code
        write_report(report, args.out)
    return exit_code


if __name__ == '__main__':
    # Run as the module `suite`, the one scenarios.py imports, not as a second copy (__main__).
    sys.path.insert(0, HERE)
    import suite as _suite  # pylint: disable=import-self
    sys.exit(_suite.main())
