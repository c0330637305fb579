# gpuops.reclaim: the two commands users run are `make test` and `make demo`.
# Everything else here is a step of those two. All Python tooling lives in .venv.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
VBIN        := $(VENV)/bin
export PATH := $(CURDIR)/$(VBIN):$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.build/collections
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
LAB         := tests/lab/lab
COLL_LINK   := .build/collections/ansible_collections/gpuops/reclaim
COLL_TARBALL = $(shell sed -n 's/^namespace: *//p' galaxy.yml)-$(shell sed -n 's/^name: *//p' galaxy.yml)-$(shell sed -n 's/^version: *//p' galaxy.yml).tar.gz

.PHONY: help venv host-deps fakegpu collection-link proxmox-collection unit rules-check units-ansible-test sanity lint changelog-lint build import-check ee-check lab-test lab-test-plain lab-test-containers lab-test-runtimes molecule molecule-scenarios molecule-scenarios2 molecule-docker inotify-room test demo clean lab-down

help:
	@echo "make test   - unit, sanity, lint, build, lab integration and Molecule"
	@echo "make demo   - wedge lab hosts like the seed incidents, run playbooks/reclaim.yml, show before/after"

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

# Debian packages the lab and the stand-in driver need (CI is a fresh Debian 12 as root).
host-deps:
	tests/lab/host-deps

fakegpu:
	$(MAKE) -C tests/fakegpu

# Ansible finds the collection through ANSIBLE_COLLECTIONS_PATH; the repository root is the collection root.
collection-link:
	mkdir -p $(dir $(COLL_LINK))
	ln -sfn $(CURDIR) $(COLL_LINK)

# community.proxmox, for the pct route to Proxmox guests (its proxmox_pct_remote connection;
# README, 'LXC guests (Proxmox)'; tests/integration/test_pct.py): Galaxy is out of reach here,
# so it is taken from PyPI's `ansible` package, which bundles it (ansible 12.2.0 carries
# community.proxmox 1.4.0; its wheel needs ansible-core~=2.19.4, the .venv's 2.19.14). Only that
# collection is unpacked, beside this one: the rest of `ansible` never reaches a path Ansible
# or ansible-lint reads. The connection's paramiko is pinned in requirements-dev.txt.
PROXMOX_FROM    := ansible==12.2.0
PROXMOX_VERSION := 1.4.0
PROXMOX_DIR     := .build/collections/ansible_collections/community/proxmox
PROXMOX_STAMP   := $(PROXMOX_DIR)/.from-$(PROXMOX_FROM)

$(PROXMOX_STAMP):
	rm -rf .build/wheels/ansible $(PROXMOX_DIR)
	$(VPY) -m pip download -q --no-deps -d .build/wheels/ansible '$(PROXMOX_FROM)'
	$(VPY) -c 'import json, sys, zipfile; \
	z = zipfile.ZipFile(sys.argv[1]); prefix = "ansible_collections/community/proxmox/"; \
	z.extractall(".build/collections", [n for n in z.namelist() if n.startswith(prefix)]); \
	got = json.load(open(".build/collections/" + prefix + "MANIFEST.json"))["collection_info"]["version"]; \
	sys.exit(None if got == sys.argv[2] else "community.proxmox %s in %s, expected %s" % (got, sys.argv[1], sys.argv[2]))' \
	  .build/wheels/ansible/ansible-*.whl $(PROXMOX_VERSION)
	rm -rf .build/wheels/ansible
	touch $@

proxmox-collection: $(PROXMOX_STAMP)

# Each pytest stage keeps its log under $(SKIP_DIR); pytest -rsx puts a line for every skip
# (with its reason) and expected failure in it, and `make test` prints them all at its end.
SKIP_DIR := .build/skips

unit: venv fakegpu collection-link
	mkdir -p $(SKIP_DIR)
	$(VPY) -m pytest -q -rsx tests/unit 2>&1 | tee $(SKIP_DIR)/unit.log

# The alert rules shipped in prometheus/ (promtool check rules, and each alert firing and not firing:
# promtool test rules), and the run_metrics module's output through promtool's parser (check metrics).
# promtool comes from Debian's prometheus package, unpacked by tests/prometheus/fetch: installed, the
# package would start a Prometheus server on :9090 (issue 33).
rules-check: venv collection-link
	tests/prometheus/fetch
	.build/prometheus/promtool check rules prometheus/gpuops-reclaim.rules.yml
	.build/prometheus/promtool test rules tests/prometheus/gpuops-reclaim.rules.test.yml
	GPUOPS_REQUIRE_PROMTOOL=1 $(VPY) -m pytest -q tests/unit/plugins/module_utils/test_prom_text.py tests/unit/plugins/module_utils/test_gpu_metrics.py

# Sanity once per ansible-core version claimed: the pinned one in .venv (2.19) and the
# oldest (tests/sanity/requirements-oldest.txt, 2.16) in a venv of its own; each version
# reads its own tests/sanity/ignore-X.Y.txt.
OLDEST_VENV := .build/venv-oldest-core
$(OLDEST_VENV)/.installed: tests/sanity/requirements-oldest.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -r tests/sanity/requirements-oldest.txt
	touch $@

sanity: venv $(OLDEST_VENV)/.installed
	tests/sanity/run
	PATH=$(CURDIR)/$(OLDEST_VENV)/bin:$$PATH tests/sanity/run

# ansible-test's own unit runner over tests/unit (make unit runs the same tests with pytest).
units-ansible-test: venv fakegpu
	tests/sanity/run units

# Plain ansible-lint, as a contributor runs it in a fresh clone: none of this Makefile's
# Ansible environment (the production profile and offline mode come from .ansible-lint).
lint: venv
	env -u ANSIBLE_COLLECTIONS_PATH -u ANSIBLE_CONFIG $(VBIN)/ansible-lint

# The fragments and the released changelog (changelogs/), as antsibull-changelog reads them.
changelog-lint: venv
	$(VBIN)/antsibull-changelog lint

# The artifact users install; check_artifact lists it and fails on any development tree in it.
build: venv
	mkdir -p .build/dist
	$(VBIN)/ansible-galaxy collection build --force --output-path .build/dist .
	$(VPY) tests/sanity/check_artifact.py .build/dist/$(COLL_TARBALL)

# The tarball through galaxy-importer with Automation Hub's settings (offline): fails on any
# error or warning, a plugin listed twice or without docs, a role without a README.
import-check: build
	$(VPY) tests/sanity/import_check.py .build/dist/$(COLL_TARBALL)

# execution-environment.yml through `ansible-builder create` (no image build); checks the context.
ee-check: build
	$(VPY) tests/sanity/ee_check.py

# The container tests need nodes with podman and a cgroup v2 tree (LAB_CONTAINERS=1): they
# get a private lab of their own, so the other tests' nodes stay lean.
# Its paths and addresses follow the caller's lab (LAB_STATE, LAB_RUN, LAB_ADDR_BASE), so two
# people's `make lab-test` never share a node: base + 40 unless LAB_CONTAINERS_ADDR_BASE says.
# (The two-labs test in test_lab_isolation.py uses base + 20 the same way.)
CONTAINER_LAB = LAB_CONTAINERS=1 LAB_NODES=1 \
	LAB_STATE=$${LAB_STATE:-/var/lib/gpuops-lab}-containers LAB_RUN=$${LAB_RUN:-/run/gpuops-lab}-containers \
	LAB_ADDR_BASE=$${LAB_CONTAINERS_ADDR_BASE:-$$(( $${LAB_ADDR_BASE:-10} + 40 ))}

# The runtime tests (real dockerd, supervisord, runit: the runtimes layer, LAB_RUNTIMES=1) get
# a private lab the same way: base + 50 unless LAB_RUNTIMES_ADDR_BASE says.
RUNTIMES_LAB = LAB_RUNTIMES=1 LAB_NODES=1 \
	LAB_STATE=$${LAB_STATE:-/var/lib/gpuops-lab}-runtimes LAB_RUN=$${LAB_RUN:-/run/gpuops-lab}-runtimes \
	LAB_ADDR_BASE=$${LAB_RUNTIMES_ADDR_BASE:-$$(( $${LAB_ADDR_BASE:-10} + 50 ))}
RUNTIME_TESTS = tests/integration/test_docker.py tests/integration/test_supervisors.py tests/integration/test_lxc.py \
	tests/integration/test_container_health.py tests/integration/test_port_owner.py \
	tests/integration/test_pct.py tests/integration/test_owner_cli.py

# What every lab and Molecule stage needs first. `make test` makes it once, then runs the stages
# side by side (tests/run_stages.py, with RUN_STAGES=1 for them), so no two stages run apt, ln or
# the stand-in's build at the same time. A stage run alone (`make lab-test-plain`) makes it itself.
LAB_PREREQS = $(if $(RUN_STAGES),,venv host-deps fakegpu collection-link proxmox-collection)

# The plain lab's tests over LAB_WORKERS node sets (pytest-xdist), one private lab per worker
# (tests/integration/worker_lab.py: worker 1 keeps yours, the others derive theirs; their bases,
# LAB_WORKER_ADDR_BASES, default to base + 165, + 185, + 205). --dist load: the tests are
# independent, and a worker takes the next test as it finishes one.
LAB_WORKERS ?= 3
PYTEST_LAB = $(VPY) -m pytest -q -rsx --durations=15

lab-test-plain: $(LAB_PREREQS)
	mkdir -p $(SKIP_DIR)
	$(PYTEST_LAB) -n $(LAB_WORKERS) --dist load tests/integration 2>&1 | tee $(SKIP_DIR)/lab-test.log

lab-test-containers: $(LAB_PREREQS)
	mkdir -p $(SKIP_DIR)
	$(CONTAINER_LAB) $(PYTEST_LAB) tests/integration/test_containers.py tests/integration/test_container_health.py tests/integration/test_server_state_containers.py 2>&1 | tee $(SKIP_DIR)/lab-test-containers.log

lab-test-runtimes: $(LAB_PREREQS)
	mkdir -p $(SKIP_DIR)
	$(RUNTIMES_LAB) $(PYTEST_LAB) $(RUNTIME_TESTS) 2>&1 | tee $(SKIP_DIR)/lab-test-runtimes.log

lab-test: lab-test-plain lab-test-containers lab-test-runtimes

# From the collection root, molecule finds extensions/molecule/*/ and the shared
# extensions/molecule/config.yml; the default scenario's create boots the lab once for all the
# scenarios of one `molecule test` and its destroy stops it after the last (shared_state).
# Its node runs podman (LAB_CONTAINERS=1), so the podman scenario shares that one boot; the
# systemd scenarios do not notice it. They run in two halves side by side, each in a private lab
# of its own (`...-molecule` at base + 30 and `...-molecule2` at base + 55;
# LAB_MOLECULE_ADDR_BASE, LAB_MOLECULE2_ADDR_BASE override), so they also run beside the lab
# tests: the first half is MOLECULE_FIRST, the second every other scenario but docker (a new
# scenario lands there). Each half keeps its Molecule state (one directory for its scenarios) in
# a directory of its own. The docker scenario needs a runtime node (docker.io; a node is a
# container node or a runtime node, never both): it runs alone in the private runtimes lab of
# lab-test (its own create and destroy; one node, booted in about 2 s), after lab-test-runtimes
# in `make test`.
MOLECULE_FIRST := default adopt flag_change fresh_deploy
MOLECULE_LAB = LAB_CONTAINERS=1 \
	LAB_STATE=$${LAB_STATE:-/var/lib/gpuops-lab}-molecule LAB_RUN=$${LAB_RUN:-/run/gpuops-lab}-molecule \
	LAB_ADDR_BASE=$${LAB_MOLECULE_ADDR_BASE:-$$(( $${LAB_ADDR_BASE:-10} + 30 ))}
MOLECULE2_LAB = LAB_CONTAINERS=1 \
	LAB_STATE=$${LAB_STATE:-/var/lib/gpuops-lab}-molecule2 LAB_RUN=$${LAB_RUN:-/run/gpuops-lab}-molecule2 \
	LAB_ADDR_BASE=$${LAB_MOLECULE2_ADDR_BASE:-$$(( $${LAB_ADDR_BASE:-10} + 55 ))}

molecule-scenarios: $(LAB_PREREQS)
	rm -rf .build/molecule/scenarios
	MOLECULE_EPHEMERAL_DIRECTORY=$(CURDIR)/.build/molecule/scenarios $(MOLECULE_LAB) $(VBIN)/molecule test $(foreach s,$(MOLECULE_FIRST),-s $(s))

molecule-scenarios2: $(LAB_PREREQS)
	rm -rf .build/molecule/scenarios2
	MOLECULE_EPHEMERAL_DIRECTORY=$(CURDIR)/.build/molecule/scenarios2 $(MOLECULE2_LAB) $(VBIN)/molecule test --all --exclude docker $(foreach s,$(MOLECULE_FIRST),--exclude $(s))

molecule-docker: $(LAB_PREREQS)
	rm -rf .build/molecule/docker
	MOLECULE_EPHEMERAL_DIRECTORY=$(CURDIR)/.build/molecule/docker $(RUNTIMES_LAB) $(VBIN)/molecule test -s docker

molecule: molecule-scenarios molecule-scenarios2 molecule-docker

# The stages of `make test`, in lanes: the lanes run at the same time, the stages of a lane
# one after another (tests/run_stages.py; each stage's log whole in .build/logs/STAGE.log, printed
# when it ends). Lab stages that share a lab share a lane. Add a stage here.
TEST_LANES := \
	unit+rules-check+sanity+lint+changelog-lint+build+import-check+ee-check \
	lab-test-plain \
	lab-test-containers \
	lab-test-runtimes+molecule-docker \
	molecule-scenarios \
	molecule-scenarios2

# Every lab node's root processes hold about 10 of root's inotify instances (tests/lab/README.md),
# and make test boots some 15 nodes at once (LXC guests besides): more than the kernel's default
# of 128 that every lab on the machine shares. As root (CI), make test raises the limit to 1024
# when it is lower; where /proc/sys is read-only, `lab up` refuses clearly, naming the sysctl.
INOTIFY_INSTANCES := 1024

inotify-room:
	@limit=$$(cat /proc/sys/fs/inotify/max_user_instances); \
	if [ "$$(id -u)" = 0 ] && [ "$$limit" -lt $(INOTIFY_INSTANCES) ]; then \
	  echo "raising fs.inotify.max_user_instances from $$limit to $(INOTIFY_INSTANCES) (concurrent lab stages)"; \
	  echo $(INOTIFY_INSTANCES) > /proc/sys/fs/inotify/max_user_instances || echo "could not raise it: lab up will say so if nodes do not fit"; \
	fi

test: venv host-deps fakegpu collection-link proxmox-collection inotify-room
	rm -rf $(SKIP_DIR) .build/logs
	RUN_STAGES=1 $(PYTHON) tests/run_stages.py --logs .build/logs --table .build/test-times.txt --skips $(SKIP_DIR) $(TEST_LANES)

demo: venv host-deps fakegpu collection-link
	tests/demo/run

lab-down:
	$(LAB) down

clean: lab-down
	rm -rf .build tests/fakegpu/build
