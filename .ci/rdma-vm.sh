#!/usr/bin/env bash
# rdma-vm.sh: prove provider/ibverbs on real RDMA verbs. Builds the
# package's tests with -tags rdma (cgo + libibverbs) on the host and runs
# them inside a throw-away qemu VM booting Debian's kernel with rdma_rxe
# (soft-RoCE, rxe0 on dummy0 10.0.0.1), through .ci/vm/run-vm.sh. The suite
# opens rxe0 twice and runs verbs/conformance on it.
#
#   .ci/rdma-vm.sh                         # the whole run
#   .ci/rdma-vm.sh -test.run 'Conformance/RC'   # extra go test flags
#   KRCORE_RDMA_RACE=1 .ci/rdma-vm.sh           # built with -race
#   KRCORE_IBV_STRICT=1 .ci/rdma-vm.sh          # also run what rxe fails
#
# Without KVM the VM runs under TCG: a cold run (apt packages, kernel,
# initramfs) takes about a minute more than a warm one.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

. .ci/rdma-host.sh rdma-vm

# Build outside the tree: the VM shares only this directory, and the
# repository stays clean.
work=$(mktemp -d /tmp/krcore-rdma-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== go test -c -tags rdma ./provider/ibverbs/"
go vet -tags rdma ./provider/ibverbs/
race=""
[ "${KRCORE_RDMA_RACE:-0}" = 1 ] && race=-race   # the race detector in the guest
go test -c $race -tags rdma -o "$work/ibverbs.test" ./provider/ibverbs/

echo "== running in the rdma VM (rxe0)"
cd "$work"
set +e
# The guest sees none of the host's environment: forward the test's knobs
# (KRCORE_IBV_DEVICE, KRCORE_IBV_GID_INDEX, KRCORE_IBV_STRICT) on the
# command line.
envs=$(env | grep -E '^KRCORE_IBV_[A-Z_]+=[A-Za-z0-9_.-]*$' | tr '\n' ' ' || true)
KRCORE_VM_SHARE="$work" "$VM" "${envs}./ibverbs.test -test.v -test.count=1 -test.timeout=12m $*"
rc=$?
set -e
echo "rdma-vm: exit $rc, wall time $(( $(date +%s) - start ))s"
exit $rc
