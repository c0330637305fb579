"""roles/inference_service/files/adopt.py's SIGKILL-at-once rule (the ladder's): read from a real
process's /proc/PID/status. The scope and the stop run in the lab (the adopt scenario, make demo)."""

import importlib.util
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "inference_service", "files", "adopt.py")


def load():
    spec = importlib.util.spec_from_file_location("adopt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


adopt = load()
WAIT = "import signal, sys, time\n%s\nprint('ready', flush=True)\ntime.sleep(60)\n"


def started(code):
    proc = subprocess.Popen([sys.executable, "-c", WAIT % code], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"   # its handlers are in place
    return proc


def test_a_process_ignoring_sigterm_is_seen_and_one_with_a_handler_or_none_is_not():
    ignoring = started("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    handling = started("signal.signal(signal.SIGTERM, lambda *_: None)")
    plain = started("")
    try:
        assert adopt.ignores_term(ignoring.pid) is True
        # A handler is SigCgt, not SigIgn: the ladder gives it its grace, and so does adoption.
        assert adopt.ignores_term(handling.pid) is False
        assert adopt.ignores_term(plain.pid) is False
    finally:
        for proc in (ignoring, handling, plain):
            proc.kill()
            proc.wait()
    assert adopt.ignores_term(ignoring.pid) is False   # gone: no claim
