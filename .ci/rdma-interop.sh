#!/usr/bin/env bash
# rdma-interop.sh: krbench on real verbs. Builds cmd/krbench with -tags rdma
# (cgo + libibverbs) on the host and, in ONE session of the throw-away qemu
# VM of .ci/vm/run-vm.sh (Debian's kernel, rdma_rxe: rxe0 on dummy0
# 10.0.0.1, rdma-core's ibverbs-utils), runs:
#
#   1. krbench pingpong (server) <- rdma-core's ibv_rc_pingpong (client)
#   2. ibv_rc_pingpong (server)  <- krbench pingpong -e (client: CQ events)
#      both on rxe0 with -g <the RoCE v2 IPv4-mapped GID index>, -c on;
#   3. krbench -server/-client -provider ibverbs between two processes on
#      rxe0: the raw RC connect phases beside KRCore cold and warm connects
#      (the runtime in RC-only mode: rxe has no DC), 8 B READ and WRITE
#      through a VQ beside a raw RC QP, and 8 B READ, WRITE, SEND and atomic
#      latency;
#   4. krcored -provider ibverbs on rxe0 (RC-only: rxe has no DC), joined to
#      the MetaServer of a krbench -server -keep-runtime, and krbench -client
#      -daemon: warm connects and 8 B READ/WRITE and 64 B SEND through the
#      daemon beside the raw RC connect phases, MetaServer fetch and raw QP
#      on the client's own device; then krctl status and list qps.
#
# Every step must exit 0; the outputs are printed. Exit status: 0 when all
# passed, 1 on a failure, 124/125 when the VM itself failed (run-vm.sh).
#
#   .ci/rdma-interop.sh
#   KRCORE_INTEROP_ITERS=1000 .ci/rdma-interop.sh   # longer ping-pongs
#
# A warm run (VM cache built by an earlier run) takes about 90 s under TCG
# (step 4: a few hundred usec to ms per round trip through the daemon).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

. .ci/rdma-host.sh rdma-interop

iters="${KRCORE_INTEROP_ITERS:-200}"
case "$iters" in ''|*[!0-9]*) echo "rdma-interop: KRCORE_INTEROP_ITERS=$iters is not a number" >&2; exit 1 ;; esac

# Build outside the tree: the VM shares only this directory.
work=$(mktemp -d /tmp/krcore-rdma-interop.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== go build -tags rdma ./cmd/krbench ./cmd/krcored ./cmd/krctl"
go vet -tags rdma ./cmd/krbench ./internal/bench/... ./cmd/krcored ./cmd/krctl ./daemon/...
for c in krbench krcored krctl; do go build -tags rdma -o "$work/$c" ./cmd/$c; done

# The guest's part. Its shell is bash; every step is bounded by timeout(1).
cat >"$work/interop.sh" <<'GUEST'
set -u
iters="$1"
dev=rxe0
fail=0

# The RoCE v2 GID holding an IPv4-mapped address (rxe on dummy0's 10.0.0.1).
gid=""
for f in /sys/class/infiniband/$dev/ports/1/gids/*; do
  i=${f##*/}
  t=$(cat /sys/class/infiniband/$dev/ports/1/gid_attrs/types/$i 2>/dev/null) || continue
  case "$t:$(cat "$f")" in
    "RoCE v2:0000:0000:0000:0000:0000:ffff:"*) gid=$i; break ;;
  esac
done
if [ -z "$gid" ]; then
  echo "interop: $dev has no RoCE v2 IPv4-mapped GID"; ibv_devinfo -v -d $dev; exit 1
fi
echo "== $dev: RoCE v2 IPv4-mapped GID index $gid ($(cat /sys/class/infiniband/$dev/ports/1/gids/$gid))"

# wait_listen PORT: until something listens on TCP PORT (C's stdout is
# buffered into a file, so its "local address" line cannot be waited for).
wait_listen() {
  local hex; hex=$(printf '%04X' "$1")
  for _ in $(seq 1 200); do
    if grep -q ":$hex [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "interop: nothing listens on port $1 after 10 s"; return 1
}

# pair NAME PORT SERVER-CMD CLIENT-CMD: server in the background, client
# in the foreground; both must exit 0.
pair() {
  local name=$1 port=$2 scmd=$3 ccmd=$4 src crc
  echo
  echo "== $name"
  echo "-- server: $scmd"
  $scmd >srv.out 2>&1 &
  local spid=$!
  if ! wait_listen "$port"; then kill $spid 2>/dev/null; wait $spid; cat srv.out; fail=1; return; fi
  timeout 120 $ccmd >cli.out 2>&1; crc=$?
  # The server finishes with the client; bound its wait all the same.
  ( sleep 60; kill $spid 2>/dev/null ) & local wpid=$!
  wait $spid; src=$?
  kill $wpid 2>/dev/null; wait $wpid 2>/dev/null
  sed 's/^/   server| /' srv.out
  echo "-- client: $ccmd"
  sed 's/^/   client| /' cli.out
  echo "-- $name: server exit $src, client exit $crc"
  if [ "$src" != 0 ] || [ "$crc" != 0 ]; then fail=1; fi
}

pp="-d $dev -g $gid -n $iters -c"
pair "krbench pingpong server <- ibv_rc_pingpong client" 18515 \
  "./krbench pingpong $pp -timeout 60s" "ibv_rc_pingpong $pp 10.0.0.1"
pair "ibv_rc_pingpong server <- krbench pingpong client" 18516 \
  "timeout 120 ibv_rc_pingpong $pp -p 18516" "./krbench pingpong $pp -e -p 18516 -timeout 60s 10.0.0.1"
ib="-provider ibverbs -ib-dev $dev -gid-idx $gid -timeout 30s"
pair "krbench -provider ibverbs: raw RC vs KRCore connect, VQ vs QP, 8 B latencies, two processes on $dev" 18517 \
  "./krbench -server -once -port 18517 $ib" \
  "./krbench -client 127.0.0.1:18517 $ib connect vq-lat read-lat write-lat send-lat atomic-lat -n $iters"

# bounded_wait PID SECONDS: wait for PID, killing it after SECONDS; its
# exit status.
bounded_wait() {
  local pid=$1 rc
  ( sleep "$2"; kill "$pid" 2>/dev/null ) & local wpid=$!
  wait "$pid"; rc=$?
  kill $wpid 2>/dev/null; wait $wpid 2>/dev/null
  return $rc
}

# daemon_step PORT: a -keep-runtime server, krcored on rxe0 joined to its
# MetaServer, krbench -client -daemon through it, krctl; all must exit 0.
daemon_step() {
  local port=$1 sock=/tmp/krcored-interop.sock src=0 crc=0 krc=0 s1=0 s2=0 meta kpid spid
  echo
  echo "== krcored -provider ibverbs on $dev (RC-only) <- krbench -client -daemon: connect, vq through the daemon beside raw RC"
  rm -f $sock
  # -idle: the control connection is silent while the client measures
  # connects/s through the daemon, which takes minutes under TCG.
  echo "-- server: ./krbench -server -once -keep-runtime -idle 10m -port $port $ib"
  ./krbench -server -once -keep-runtime -idle 10m -port $port $ib >dsrv.out 2>&1 &
  spid=$!
  if ! wait_listen "$port"; then kill $spid 2>/dev/null; wait $spid; cat dsrv.out; fail=1; return; fi
  meta=$(sed -n 's/^krbench server meta: //p' dsrv.out)
  echo "-- server's MetaServer: $meta"
  # -spin: the pump polls the rings as krbench polls its CQs, as krbench
  # daemon runs it; -node 100: outside the ids the server hands clients.
  local kcmd="./krcored -provider ibverbs -ib-dev $dev -gid-idx $gid -node 100 -spin 200us -socket $sock -log-level info"
  echo "-- daemon: $kcmd -meta \"$meta\""
  timeout 300 $kcmd -meta "$meta" >kd.out 2>&1 &
  kpid=$!
  for _ in $(seq 1 200); do [ -S $sock ] && break; kill -0 $kpid 2>/dev/null || break; sleep 0.05; done
  if [ ! -S $sock ]; then
    echo "interop: krcored made no socket in 10 s"; kill $kpid $spid 2>/dev/null; wait $kpid; wait $spid
    sed 's/^/   krcored| /' kd.out; sed 's/^/   server| /' dsrv.out; fail=1; return
  fi
  # -n: each warm connect through the daemon is a ring round trip between
  # two processes, a few hundred usec under TCG; the connects/s series
  # makes 100 per -n per goroutine and block.
  local ccmd="./krbench -client 127.0.0.1:$port $ib -daemon $sock connect vq -n $dn"
  timeout 180 $ccmd >dcli.out 2>&1 || crc=$?
  timeout 20 ./krctl -socket $sock status >ctl.out 2>&1 || s1=$?
  echo "-- ./krctl list qps" >>ctl.out
  timeout 20 ./krctl -socket $sock list qps >>ctl.out 2>&1 || s2=$?
  kill -TERM $kpid 2>/dev/null
  bounded_wait $kpid 20 || krc=$?
  bounded_wait $spid 60 || src=$?
  sed 's/^/   server| /' dsrv.out
  sed 's/^/   krcored| /' kd.out
  echo "-- client: $ccmd"
  sed 's/^/   client| /' dcli.out
  echo "-- ./krctl -socket $sock status"
  sed 's/^/   krctl| /' ctl.out
  echo "-- daemon step: server exit $src, krcored exit $krc, client exit $crc, krctl status $s1, list qps $s2"
  if [ "$src" != 0 ] || [ "$krc" != 0 ] || [ "$crc" != 0 ] || [ "$s1" != 0 ] || [ "$s2" != 0 ]; then fail=1; fi
}
dn=$(( iters < 50 ? iters : 50 ))
daemon_step 18518

echo
if [ "$fail" = 0 ]; then echo "interop: all passed"; else echo "interop: FAILED"; fi
exit $fail
GUEST

echo "== running in the rdma VM (rxe0)"
cd "$work"
set +e
KRCORE_VM_SHARE="$work" "$VM" "bash ./interop.sh $iters"
rc=$?
set -e
echo "rdma-interop: exit $rc, wall time $(( $(date +%s) - start ))s"
exit $rc
