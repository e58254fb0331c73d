# topolet: `make run` builds and runs the standalone agent on this machine; `make test` runs everything.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_DIR ?= $(CURDIR)/.run
HWLOC_DATA := tests/data/hwloc
FUZZ_SECONDS ?= 30
NATIVE_SRC := $(wildcard csrc/*.c csrc/*.h) csrc/Makefile agent/_native_build.py setup.py pyproject.toml

.PHONY: run test setup deps install lint typecheck native-check fuzz conformance pytest unit integration bench \
        clean controlplane controlplane-kubernetes controlplane-others peers vm

$(STAMP): $(NATIVE_SRC)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel cffi
	$(BIN)/pip install -q --no-build-isolation -e '.[test,gpu,kube]'
	touch $@

install: $(STAMP)

# System packages the tests need: hwloc's lstopo (the reference), clang + libFuzzer runtime (fuzzing),
# and Prometheus with its promtool (the alert rules' unit tests and the live scrape test). Prometheus
# without its recommended node exporter: the tests start the server themselves, on ports of their own.
# qemu, debootstrap and cpio build and boot the cgroup-v2 guest (tests/vm); its kernel is fetched by
# tests/vm/build.sh with `apt-get download`, never installed on this host.
deps:
	@if ! command -v lstopo-no-graphics >/dev/null || ! command -v clang >/dev/null \
	    || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 \
	    || ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    hwloc-nox clang libclang-rt-14-dev >/dev/null \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus >/dev/null; \
	fi
	@if ! command -v qemu-system-x86_64 >/dev/null || ! command -v debootstrap >/dev/null \
	    || ! command -v cpio >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    qemu-system-x86 debootstrap cpio >/dev/null; \
	fi
	@# The real node of tests/realnode: Debian's containerd and runc, the CNI plugins, and busybox-static
	@# (its image, built there). Installed, never started here as services: the tests run their own.
	@if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || ! test -x /usr/lib/cni/ptp \
	    || ! test -x /bin/busybox; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    containerd runc containernetworking-plugins busybox-static >/dev/null; \
	fi

run: install
	mkdir -p $(RUN_DIR)/state $(RUN_DIR)/features.d
	$(BIN)/topolet agent --state-dir $(RUN_DIR)/state --features-dir $(RUN_DIR)/features.d

lint: install
	$(BIN)/ruff check agent tests bench

typecheck: install
	$(BIN)/mypy

native-check:
	$(MAKE) -C csrc check

fuzz: deps
	$(MAKE) -C csrc fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

conformance: install
	$(BIN)/python $(HWLOC_DATA)/hwloc_conformance.py --data $(HWLOC_DATA) -- \
	  $(BIN)/topolet discover --fsroot {root} --format conformance

# The Go builds of tests/controlplane/build.sh (the control plane, the kubelet, Kueue, the training
# operators, containerd, Helm), from the Go module proxy once and cached under
# ~/.cache/topolet/controlplane (cold, about 20 minutes of 2 cores). Two chains that share few Go
# packages, for `make -j` to run side by side: the components of k8s.io/kubernetes, and the others (Helm
# 4, which shares k8s.io/api with the first chain, last, when Go's build cache holds those packages).
# `controlplane` then lists every component's binary, building any component neither chain names.
KUBERNETES_COMPONENTS := kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet
OTHER_COMPONENTS := etcd kueue mpi-operator lws containerd containerd-shim-runc-v2 helm3 helm
# The training operators Kueue's tests start (tests/controlplane/operators.py), split so that the chains
# stay about as long: JobSet and Trainer (which builds on JobSet's API) end the Kubernetes chain.
KUBERNETES_CHAIN := $(KUBERNETES_COMPONENTS) jobset trainer

controlplane-kubernetes:
	tests/controlplane/build.sh $(KUBERNETES_CHAIN) >/dev/null

controlplane-others:
	tests/controlplane/build.sh $(OTHER_COMPONENTS) >/dev/null

controlplane: controlplane-kubernetes controlplane-others
	tests/controlplane/build.sh

# The benchmarks' peers (third_party/: kube-scheduler with scheduler-plugins' NodeResourceTopologyMatch
# and Coscheduling), cached under ~/.cache/topolet/peers; about a minute once the Kubernetes chain has
# filled Go's build cache, so after it.
peers: controlplane-kubernetes
	third_party/build.sh

# The throwaway cgroup-v2 guest for tests/vm (Debian's kernel + a minbase root file system), cached under
# ~/.cache/topolet/vm (a cold build takes about 3 minutes, most of it debootstrap).
vm: deps
	tests/vm/build.sh

PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# Both cores: TEST_JOBS pytest-xdist workers, each taking one group of tests at a time (a file, or a lane
# of tests sharing a part of the machine; tests/lanes.py), the longest first; the slowest tests listed.
TEST_JOBS ?= 2
PYTEST_PAR := $(PYTEST) -n $(TEST_JOBS) --no-loadscope-reorder
PYTEST_ALL := $(PYTEST_PAR) --durations=30

pytest: install controlplane peers vm image
	$(PYTEST_ALL) tests

# The test tiers (CONTRIBUTING.md, "Test tiers"; tests/conftest.py marks `integration`): `unit` needs only
# the venv (no root, cgroups, control plane, guest, image, real node, network or tool of `make deps`) and
# leaves out the `slow` sweeps over real machines; `integration` is the rest, on the real parts `pytest`
# builds. Together they are `pytest`. `unit` runs Hypothesis' "unit" profile (tests/conftest.py): a quarter
# of each property test's examples, all of which `pytest`, `integration` and `test` run.
unit: install
	$(PYTEST_PAR) --hypothesis-profile=unit -m "not integration and not slow" tests

integration: deps install controlplane peers vm image
	$(PYTEST_ALL) -m "integration or slow" tests

# `make test` = `setup`, SETUP_JOBS targets at a time, then pytest. The two Go chains start first and
# take two jobs for most of the set-up; the third runs the rest beside them (apt, the venv, the checks,
# the fuzzer, the guest's and the image's debootstrap). Each target's output is printed whole when it
# ends; a failed target fails the run once the jobs already running end, and pytest never starts.
SETUP_JOBS ?= 3

setup: controlplane-kubernetes controlplane-others deps install lint typecheck native-check fuzz conformance \
       peers controlplane vm image

test:
	@$(MAKE) -j$(SETUP_JOBS) --output-sync=target --no-print-directory setup \
	  || { echo "make test: the set-up failed (the make error above names the target); no pytest run" >&2; \
	       exit 1; }
	$(PYTEST_ALL) tests

bench: install
	$(BIN)/python bench/discover.py
	$(BIN)/python bench/alloc.py
	$(BIN)/python bench/pin.py
	$(BIN)/python bench/footprint.py

clean:
	rm -rf $(VENV) build *.egg-info agent/_native*.so agent/_native.c $(RUN_DIR)

# The agent's OCI image (image/README.md): build/image/topolet-<version>.tar, a docker-archive tagged
# localhost/topolet:<version> for `ctr -n k8s.io images import`, and the same image as an OCI layout in
# build/image/oci. Offline: the base is a debootstrap rootfs cached under ~/.cache/topolet/image (about
# 2 minutes, once); a warm build takes about 1.5 minutes on 2 cores. IMAGE_BASE=<image> builds the same
# recipe on a public base (docker.io/library/debian:bookworm-slim) instead.
.PHONY: image image-arm64 image-multiarch image-push image-check image-deps
image: image-deps install
	image/build.sh

# The same recipe for arm64 under qemu-user (build/image-arm64; its base and the compiled C helper are
# cached like the amd64 base), and both combined into one OCI image index (build/image-index/oci).
image-arm64: image-deps install
	IMAGE_ARCH=arm64 image/build.sh

image-multiarch: image-deps install
	image/push.sh

# Builds both architectures, pushes the index with skopeo and prints the digest to pull:
#   make image-push REGISTRY=registry.example.com/team      (skopeo login registry.example.com first)
# IMAGE_PUSH_TLS_VERIFY=false for a registry served over plain HTTP.
image-push: image-deps install
	@test -n "$(REGISTRY)" || { echo "usage: make image-push REGISTRY=registry.example.com/team" >&2; exit 2; }
	image/push.sh $(REGISTRY)

# Reproducibility: builds the last commit twice and fails unless the digests are the same.
image-check: image-deps install
	image/check.sh

# Debian's debootstrap (the base), buildah (the build, chroot isolation: no runtime needed), umoci
# (tests/image unpacks the built image with it), qemu-user-static (the arm64 image, image/binfmt.sh),
# skopeo (the push) and docker-registry (distribution's registry: tests/image pushes to a throwaway one).
# tests/image builds the images, so `deps` needs them.
image-deps:
	@if ! command -v debootstrap >/dev/null || ! command -v buildah >/dev/null \
	    || ! command -v umoci >/dev/null || ! command -v qemu-aarch64-static >/dev/null \
	    || ! command -v skopeo >/dev/null || ! command -v docker-registry >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    debootstrap buildah umoci qemu-user-static skopeo docker-registry >/dev/null; \
	fi

deps: image-deps
