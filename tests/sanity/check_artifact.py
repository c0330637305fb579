"""Check a built collection tarball holds what users need and no development tree.

usage: python3 tests/sanity/check_artifact.py DIST/gpuops-reclaim-X.Y.Z.tar.gz

Prints the tarball's file list and exits 1 naming every entry outside the shipped
top-level set (galaxy.yml build_ignore is what keeps them out) or a missing required file.
"""

import sys
import tarfile

SHIPPED_TOP = {"FILES.json", "MANIFEST.json", "LICENSE", "README.md",
               "changelogs", "meta", "playbooks", "plugins", "roles"}
REQUIRED = {"LICENSE", "README.md", "meta/runtime.yml", "meta/execution-environment.yml"}
NEVER = ("__pycache__", ".pyc", ".c", ".o", ".so", ".so.1")


def problems(names):
    found = []
    for name in names:
        top = name.split("/", 1)[0]
        if top not in SHIPPED_TOP:
            found.append(f"{name}: not a shipped top-level entry (add it to build_ignore in galaxy.yml)")
        elif any(part == "__pycache__" or part.endswith(NEVER) for part in name.split("/")):
            found.append(f"{name}: build output or cache")
    for name in sorted(REQUIRED - set(names)):
        found.append(f"{name}: missing")
    return found


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with tarfile.open(argv[0]) as tar:
        names = sorted(m.name.rstrip("/") for m in tar.getmembers() if m.isfile())
    print(f"{argv[0]}: {len(names)} files")
    for name in names:
        print(f"  {name}")
    found = problems(names)
    for problem in found:
        print(f"check_artifact: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
