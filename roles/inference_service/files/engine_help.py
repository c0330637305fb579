"""The engine's own argparse --help on this host, cached per engine binary and version.

usage: engine_help.py REQUEST_JSON
  REQUEST_JSON: {"command": [argv...], "help_args": [[...], ...], "python": PATH,
                 "version_module": NAME or null, "cache_dir": PATH, "timeout": SECONDS}

Prints JSON: {"text", "version", "cached", "key", "args", "seconds", "error"}.
Stdlib only, Python 3.9+. Reading the help of a real engine imports torch (seconds to
tens of seconds); the cache makes every later run instant until the engine changes.
The cache key is the command, the launcher file's identity (path, size, mtime) and the
engine distribution's version, so an upgrade or a new binary reads the help again.
"""
import hashlib
import json
import os
import subprocess
import sys
import time


def run(argv, timeout):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", COLUMNS="200")
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return None, "%s did not answer within %s s" % (" ".join(argv), timeout)
    except OSError as exc:
        return None, "cannot run %s: %s" % (argv[0], exc)
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 or "usage:" not in out:
        err = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or [out.strip()[:200]])[-1:]
        return None, "%s exited %s: %s" % (" ".join(argv), proc.returncode, " ".join(err))
    return out, None


def version_of(python, module, timeout):
    if not module:
        return None
    code = "from importlib.metadata import version; print(version(%r))" % module
    try:
        proc = subprocess.run([python, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def identity(path):
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        return [real, st.st_size, st.st_mtime_ns]
    except OSError:
        return [path, None, None]


def main():
    req = json.loads(sys.argv[1])
    started = time.monotonic()
    command = req["command"]
    version = version_of(req.get("python") or sys.executable, req.get("version_module"), 30)
    key_src = json.dumps([command, identity(command[0]), version, req["help_args"]], sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    cache = os.path.join(req["cache_dir"], "engine-help-%s.json" % key)
    result = {"version": version, "key": key, "cached": False, "text": None, "args": None, "error": None}
    try:
        with open(cache) as f:
            saved = json.load(f)
        result.update(text=saved["text"], args=saved["args"], cached=True)
    except (OSError, ValueError, KeyError):
        errors = []
        for args in req["help_args"]:
            text, err = run(command + args, req.get("timeout", 120))
            if text is not None:
                result.update(text=text, args=args)
                break
            errors.append(err)
        if result["text"] is None:
            result["error"] = "; ".join(errors)
        else:
            os.makedirs(req["cache_dir"], mode=0o755, exist_ok=True)
            tmp = cache + ".%d.tmp" % os.getpid()
            with open(tmp, "w") as f:
                json.dump({"text": result["text"], "args": result["args"], "version": version}, f)
            os.replace(tmp, cache)
    result["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
