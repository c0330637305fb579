"""Check a built collection tarball holds what users need and no development tree.

usage: python3 tests/sanity/check_artifact.py DIST/gpuops-reclaim-X.Y.Z.tar.gz

Prints the tarball's file list and exits 1 naming every entry outside the shipped
top-level set (galaxy.yml build_ignore is what keeps them out), a missing required file,
or a role whose min_ansible_version differs from meta/runtime.yml's requires_ansible.
"""

import re
import sys
import tarfile

import yaml

SHIPPED_TOP = {"FILES.json", "MANIFEST.json", "LICENSE", "README.md", "CHANGELOG.rst",
               "changelogs", "meta", "playbooks", "plugins", "prometheus", "roles"}
REQUIRED = {"LICENSE", "README.md", "CHANGELOG.rst", "changelogs/changelog.yaml", "meta/runtime.yml",
            "meta/execution-environment.yml", "prometheus/gpuops-reclaim.rules.yml"}
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


def version_claims(read):
    """Problems where a role's min_ansible_version is not the collection's requires_ansible
    lower bound; read(name) returns a shipped file's text."""
    runtime = yaml.safe_load(read("meta/runtime.yml"))
    bound = re.fullmatch(r">=\s*(\d+\.\d+)(?:\.0)?", str(runtime.get("requires_ansible", "")).strip())
    if not bound:
        return [f"meta/runtime.yml: requires_ansible {runtime.get('requires_ansible')!r} is not '>=X.Y.0'"]
    found = []
    for name, text in read.roles():
        claimed = str((yaml.safe_load(text).get("galaxy_info") or {}).get("min_ansible_version"))
        if claimed != bound.group(1):
            found.append(f"{name}: min_ansible_version {claimed!r}, but requires_ansible is '>={bound.group(1)}.0'")
    return found


class _Reader:
    def __init__(self, tar):
        self.tar = tar

    def __call__(self, name):
        return self.tar.extractfile(name).read().decode()

    def roles(self):
        for member in self.tar.getmembers():
            if re.fullmatch(r"roles/[^/]+/meta/main\.yml", member.name):
                yield member.name, self(member.name)


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
        if "meta/runtime.yml" in names:
            found += version_claims(_Reader(tar))
    for problem in found:
        print(f"check_artifact: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
