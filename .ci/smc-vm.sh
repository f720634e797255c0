#!/usr/bin/env bash
# smc-vm.sh: the Linux kernel's own SMC-R (AF_SMC) over soft-RoCE in the
# throw-away VM of .ci/vm/run-vm.sh, as the outside peer issue 19's SMC-Rv2
# work is proven against. Boots Debian's 6.12 kernel package (6.1's rdma_rxe
# never reports its QP state to SMC, which then stalls and hangs on
# teardown) with smc, smc_diag and veth, builds the project's C tool
# (.ci/smc/ksmc.c: AF_SMC echo client/server, UEID, smc_diag reader) and
# runs .ci/smc/guest.sh: the veth topology (rxeA/rxeB), a UEID, then
# kernel-to-kernel SMC-R (smc_diag must say mode SMCR) beside plain TCP, a
# plain TCP client against a kernel AF_SMC server (must fall back with
# PEERNOSMC), no leftover AF_SMC sockets; then the Go side's tests against a
# kernel AF_SMC client (smc/internal/smcopt: the SMC option, proposal,
# decline; smc's kernel wire mode (Options.RDMA, -tags rdma): a Go
# listener and a Go dialer on rxe against the kernel, echo, link group
# reuse, ADD_LINK declined, fallbacks and close paths).
#
#   .ci/smc-vm.sh
#   KSMC_BYTES=65536 KSMC_PINGS=100 KSMC_RUNS=1 .ci/smc-vm.sh   # a shorter run
#   KSMC_CAPTURE=/tmp/cap .ci/smc-vm.sh   # keep the first contact's pcap
#   KSMC_GO_ONLY=1 .ci/smc-vm.sh          # only the Go side's tests
#   KSMC_TESTLINK=30 .ci/smc-vm.sh        # the Go process killed, at the kernel's default link test
#
# The first run downloads the 6.12 kernel package into the VM cache
# (KRCORE_VM_CACHE) and builds an initramfs for it: about a minute more.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

. .ci/rdma-host.sh smc-vm
if ! dpkg-query -W -f='${Status}' tcpdump 2>/dev/null | grep -q 'ok installed'; then
  echo "== smc-vm: apt-get install tcpdump"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 tcpdump >/dev/null
fi

work=$(mktemp -d /tmp/krcore-smc-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== gcc .ci/smc/ksmc.c"
gcc -O2 -Wall -static -pthread -o "$work/ksmc" .ci/smc/ksmc.c
cp .ci/smc/guest.sh "$work/"
# The Go side's tests: smcopt's need no cgo; smc's kernel wire mode drives
# rxe through provider/ibverbs (-tags rdma, cgo and libibverbs, copied
# into the guest).
echo "== go test -c ./smc/internal/smcopt; go test -c -tags rdma ./smc"
CGO_ENABLED=0 go test -c -o "$work/smcopt.test" ./smc/internal/smcopt
go vet -tags rdma ./smc/...
go test -c -tags rdma -o "$work/smc.test" ./smc
gotests="smcopt.test smc.test"

echo "== running in the VM (kernel 6.12, rxeA/rxeB on a veth pair)"
cd "$work"
set +e
KRCORE_VM_KERNEL_PKG=${KRCORE_VM_KERNEL_PKG:-linux-image-6.12.117+deb12-amd64} \
KRCORE_VM_EXTRA_MODS="veth smc smc_diag" KRCORE_VM_EXTRA_BINS=/usr/bin/tcpdump \
KRCORE_VM_TIMEOUT=${KRCORE_VM_TIMEOUT:-600} KRCORE_VM_SHARE="$work" \
  "$VM" "KSMC_BYTES=${KSMC_BYTES:-1048576} KSMC_PINGS=${KSMC_PINGS:-1000} KSMC_RUNS=${KSMC_RUNS:-3} KSMC_GO_ONLY=${KSMC_GO_ONLY:-0} KSMC_TESTLINK=${KSMC_TESTLINK:-5} KSMC_GO_TESTS='$gotests' bash ./guest.sh"
rc=$?
set -e
if [ -n "${KSMC_CAPTURE:-}" ]; then
  mkdir -p "$KSMC_CAPTURE" && cp -f first.pcap "$KSMC_CAPTURE/" 2>/dev/null &&
    echo "smc-vm: capture of the first contact in $KSMC_CAPTURE/first.pcap"
fi
echo "smc-vm: exit $rc, wall time $(( $(date +%s) - start ))s"
exit $rc
