#!/usr/bin/env bash
# race-vm.sh: examples/race (issue 18 §1, the elastic KVS on RACE hashing)
# on real verbs. Builds the example with -tags rdma (cgo + libibverbs) on
# the host and runs it in the throw-away qemu VM of .ci/vm/run-vm.sh
# (Debian's kernel, rdma_rxe: rxe0 on dummy0 10.0.0.1) with -provider
# ibverbs: the memory node (its runtime embedding the MetaServer), krcored
# and every client are processes on rxe0. A raw client opens its own device
# context, PD, CQ and an RC QP per memory node and connects it (endpoints
# over TCP); a daemon client attaches to krcored, which connects VQs over
# its own RC QPs (RC-only: rxe has no DC). The example reports each new
# client's time from its spawn to its first completed lookup, with its
# steps, per mode, and the ratio krcored / raw.
#
#   .ci/race-vm.sh                          # raw and daemon, 3 rounds
#   .ci/race-vm.sh -rounds 5 -spike 4       # more or other race flags
#   RACE_VM_MODES=raw,embedded,daemon .ci/race-vm.sh
#
# The flags after the script's name are the example's (go run
# ./examples/race -h), after its defaults here. Exit status: the example's,
# 124/125 when the VM itself failed (run-vm.sh). .ci/run runs it with
# -rounds 1 (about 45 s on a quiet host, under TCG), as a check that the
# example runs on real verbs; its figures need the 3 rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

. .ci/rdma-host.sh race-vm

# Build outside the tree: the VM shares only this directory.
work=$(mktemp -d /tmp/krcore-race-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== go build -tags rdma ./examples/race"
go vet -tags rdma ./examples/race
go build -tags rdma -o "$work/race" ./examples/race

# A small table (the region is registered, so pinned, in a 1 GiB guest),
# one base client, two newcomers at once; -warm leaves room for the base
# client's start under TCG; no linearizability run (go test covers it).
# Every QP keeps the provider's ACK timeout (67 ms, seven retries): under
# TCG some time out and are retried, none ran out in the runs so far;
# -ack-timeout lengthens it.
flags="-provider ibverbs -ib-dev rxe0 -modes ${RACE_VM_MODES:-raw,daemon} -keys 2000 -base 1 -spike 2"
flags="$flags -warm 15s -after 3s -rounds 3 -lin-clients 0 -out $work/out"

echo "== running in the rdma VM (rxe0): ./race $flags $*"
cd "$work"
set +e
KRCORE_VM_TIMEOUT=${KRCORE_VM_TIMEOUT:-1200} KRCORE_VM_SHARE="$work" "$VM" "./race $flags $*"
rc=$?
set -e
if [ -s out/race-bootstrap.csv ]; then
  echo "== each newcomer's bootstrap (out/race-bootstrap.csv)"
  cat out/race-bootstrap.csv
fi
echo "race-vm: exit $rc, wall time $(( $(date +%s) - start ))s"
exit $rc
