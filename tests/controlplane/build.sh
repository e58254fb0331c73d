#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), its client
# (kubectl, kustomize built in), the real node's kubelet (tests/realnode/), Kueue's manager (kueue,
# tests/controlplane/kueue.py), the training operators Kueue's tests start beside it (jobset, trainer,
# mpi-operator, lws; tests/controlplane/operators.py) and containerd 2 with its runc shim (the real node's NRI runtime,
# tests/realnode/containerd.py) and Helm (the chart's tests, tests/chart/; helm3 is the last Helm 3, for
# the NFD coexistence tests under both Helm majors) from the Go module proxy, once per version.
#
# Usage: tests/controlplane/build.sh [COMPONENT...]   (every component when none named)
# (`make controlplane` runs it as two chains side by side, KUBERNETES_COMPONENTS and OTHER_COMPONENTS.)
# Prints one `<component>=<absolute path of the binary>` line per component on stdout; progress and
# compiler output go to stderr. A binary is cached under
#   ${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/controlplane/<component>-<version>-<hash>/
# where <hash> covers the module's go.mod, go.sum and sources and the Go toolchain version, so a
# change to any of them builds a fresh binary and an unchanged tree costs nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/controlplane"

command -v go >/dev/null || { echo "build.sh: go is not on PATH" >&2; exit 2; }
go_version="$(go env GOVERSION)"

# component -> module dir, Go package to build, module whose version names the cache entry.
declare -A module_dir=([etcd]=etcd [kube-apiserver]=apiserver [kubectl]=kubectl
                       [kube-controller-manager]=apiserver [kube-scheduler]=apiserver
                       [kubelet]=kubelet [kueue]=kueue [jobset]=jobset [trainer]=trainer
                       [mpi-operator]=mpi-operator [lws]=lws
                       [containerd]=containerd [containerd-shim-runc-v2]=containerd [helm]=helm [helm3]=helm3)
declare -A package=([etcd]=. [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
                    [kubectl]=k8s.io/kubernetes/cmd/kubectl
                    [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
                    [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
                    [kubelet]=k8s.io/kubernetes/cmd/kubelet
                    [kueue]=sigs.k8s.io/kueue/cmd/kueue
                    [jobset]=sigs.k8s.io/jobset
                    [trainer]=github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
                    [mpi-operator]=github.com/kubeflow/mpi-operator/cmd/mpi-operator [lws]=sigs.k8s.io/lws/cmd
                    [containerd]=github.com/containerd/containerd/v2/cmd/containerd
                    [containerd-shim-runc-v2]=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
                    [helm]=helm.sh/helm/v4/cmd/helm [helm3]=helm.sh/helm/v3/cmd/helm)
declare -A version_of=([etcd]=go.etcd.io/etcd/server/v3 [kube-apiserver]=k8s.io/kubernetes
                       [kubectl]=k8s.io/kubernetes [kube-controller-manager]=k8s.io/kubernetes
                       [kube-scheduler]=k8s.io/kubernetes [kubelet]=k8s.io/kubernetes
                       [kueue]=sigs.k8s.io/kueue [jobset]=sigs.k8s.io/jobset
                       [trainer]=github.com/kubeflow/trainer/v2
                       [mpi-operator]=github.com/kubeflow/mpi-operator [lws]=sigs.k8s.io/lws
                       [containerd]=github.com/containerd/containerd/v2
                       [containerd-shim-runc-v2]=github.com/containerd/containerd/v2
                       [helm]=helm.sh/helm/v4 [helm3]=helm.sh/helm/v3)

# The version of module $2 as required by the go.mod in directory $1.
required_version() {
    awk -v mod="$2" '$1 == "require" && $2 == mod { print $3; exit } $1 == mod { print $2; exit }' "$1/go.mod"
}

build_one() {
    local component="$1"
    local dir="$here/${module_dir[$component]}"
    local version
    version="$(required_version "$dir" "${version_of[$component]}")"
    [[ -n "$version" ]] || { echo "build.sh: no version of ${version_of[$component]} in $dir/go.mod" >&2; exit 2; }
    local digest
    digest="$( (echo "$go_version"; cat "$dir"/go.mod "$dir"/go.sum; cat "$dir"/*.go 2>/dev/null || true) \
        | sha256sum | cut -c1-12)"
    local out_dir="$cache_root/$component-$version-$digest"
    local binary="$out_dir/$component"
    if [[ ! -x "$binary" ]]; then
        mkdir -p "$out_dir"
        # One builder at a time per entry: parallel test sessions wait for the first one's binary.
        exec {lock}>"$out_dir/.lock"
        flock "$lock"
        if [[ ! -x "$binary" ]]; then
            local ldflags="-s -w" cgo=0 tags=""
            if [[ "$component" == kube* ]]; then
                # What `kubectl version` and /version report; upstream's build stamps the same variables.
                local major minor
                major="$(echo "$version" | sed -E 's/^v([0-9]+)\..*/\1/')"
                minor="$(echo "$version" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
                local pkg=k8s.io/component-base/version
                ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
                ldflags+=" -X $pkg.gitTreeState=clean"
            elif [[ "$component" == kueue ]]; then
                # What Kueue logs at start; upstream's Makefile stamps the same variable.
                ldflags+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
            elif [[ "$component" == jobset || "$component" == lws ]]; then
                # The version each logs at start, as their Makefiles stamp it (Trainer's stamps none).
                ldflags+=" -X ${version_of[$component]}/pkg/version.GitVersion=$version"
            elif [[ "$component" == mpi-operator ]]; then
                ldflags+=" -X github.com/kubeflow/mpi-operator/pkg/version.Version=$version"
            elif [[ "$component" == containerd* ]]; then
                # As upstream's Makefile stamps it (`containerd --version`, the CRI version the kubelet
                # logs). cgo as Go defaults it and no btrfs snapshotter (it needs the btrfs headers):
                # the build docs/recipes/containerd-2.4-nri.md ran pods with.
                ldflags+=" -X github.com/containerd/containerd/v2/version.Version=$version"
                cgo="$(go env CGO_ENABLED)" tags=no_btrfs
            elif [[ "$component" == helm ]]; then
                # What `helm version` reports; upstream's Makefile stamps the same variables for a tag.
                local pkg=helm.sh/helm/v4/internal/version
                ldflags+=" -X $pkg.version=$version -X $pkg.metadata= -X $pkg.gitTreeState=clean"
            elif [[ "$component" == helm3 ]]; then
                # As Helm 4 above, and the Kubernetes version `helm template` and `helm lint` assume
                # without a cluster: upstream's Makefile stamps the client-go minor it builds with.
                local pkg=helm.sh/helm/v3/internal/version
                ldflags+=" -X $pkg.version=$version -X $pkg.metadata= -X $pkg.gitTreeState=clean"
                local k8s_minor
                k8s_minor="$(required_version "$dir" k8s.io/client-go | sed -E 's/^v0\.([0-9]+)\..*/\1/')"
                for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
                    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
                done
            fi
            echo "build.sh: building $component $version (cold builds take minutes)" >&2
            local start=$SECONDS
            (cd "$dir" && CGO_ENABLED=$cgo GOFLAGS="-mod=readonly -buildvcs=false" \
                go build -trimpath -tags="$tags" -ldflags="$ldflags" -o "$binary.tmp" "${package[$component]}") >&2
            mv -f "$binary.tmp" "$binary"
            echo "build.sh: built $component in $((SECONDS - start)) s" >&2
        fi
        exec {lock}>&-
    fi
    echo "$component=$binary"
}

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kueue
                                              jobset trainer mpi-operator lws containerd containerd-shim-runc-v2 helm helm3)
for c in "${components[@]}"; do
    [[ -n "${module_dir[$c]:-}" ]] || { echo "build.sh: unknown component '$c'" >&2; exit 2; }
    build_one "$c"
done
