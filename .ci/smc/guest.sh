# guest.sh: the in-VM part of .ci/smc-vm.sh (run by bash in the guest, in
# the directory holding ksmc and the Go test binaries). Builds the topology
# under which the kernel's SMC-R runs over soft-RoCE, then runs the checks
# and prints "check NAME ok|FAIL" lines; exits non-zero if any failed.
set -u
fail=0
check() {  # check NAME CONDITION-STATUS
  if [ "$2" = 0 ]; then echo "check $1 ok"; else echo "check $1 FAIL"; fail=1; fi
}
log() { echo "===== [$(cut -d' ' -f1 /proc/uptime)s] $*"; }

log "kernel $(uname -r)"
[ -d /sys/module/smc ] && [ -d /sys/module/smc_diag ]; check smc-modules $?

# Topology: a veth pair, both ends in the initial network namespace (rxe up
# to 6.15 takes RoCE packets only there), rxeA on vethA 10.1.0.1 and rxeB
# on vethB 10.1.0.2. Policy routing sends traffic between the two local
# addresses across the pair instead of lo, so each side's RDMA device is
# the one on its own address.
ip link add vethA type veth peer name vethB
ip addr add 10.1.0.1/24 dev vethA
ip addr add 10.1.0.2/24 dev vethB
ip link set vethA up
ip link set vethB up
for c in all default vethA vethB; do
  echo 1 >/proc/sys/net/ipv4/conf/$c/accept_local
  echo 0 >/proc/sys/net/ipv4/conf/$c/rp_filter
done
ip neigh replace 10.1.0.1 lladdr "$(cat /sys/class/net/vethA/address)" dev vethB nud permanent
ip neigh replace 10.1.0.2 lladdr "$(cat /sys/class/net/vethB/address)" dev vethA nud permanent
ip rule add pref 100 lookup local
ip rule del pref 0 lookup local
ip route add 10.1.0.1 dev vethB src 10.1.0.2 table 10
ip route add 10.1.0.2 dev vethA src 10.1.0.1 table 11
ip rule add pref 10 iif lo to 10.1.0.1 lookup 10
ip rule add pref 11 iif lo to 10.1.0.2 lookup 11
rdma link add rxeA type rxe netdev vethA && rdma link add rxeB type rxe netdev vethB
check rxe-on-veth $?

# rxe has RoCEv2 GIDs only, so only SMC-Rv2, which the kernel offers only
# with a UEID; both ends share this host's table.
./ksmc ueid-add KRCORE-SMC-CI; check ueid $?

# figure NAME FILE: the 1 MiB echo's time and the 8 B round trip of a
# ksmc client's output, kept in figures.log for the ratios at the end.
figure() {
  local ms rtt
  ms=$(sed -n 's/.*bulk bytes=[0-9]* ms=\([0-9.]*\).*/\1/p' "$2" | head -n 1)
  rtt=$(sed -n 's/.*pingpong n=[0-9]* rtt_us=\([0-9.]*\).*/\1/p' "$2" | head -n 1)
  [ -n "$ms" ] && [ -n "$rtt" ] && echo "figure $1 bulk_ms=$ms rtt_us=$rtt" >>figures.log
}
: >figures.log

BYTES=${KSMC_BYTES:-1048576}
PINGS=${KSMC_PINGS:-1000}
port=5100
pair() {  # pair NAME SERVER-FLAGS CLIENT-FLAGS: one echo connection
  port=$((port + 1))
  ./ksmc serve $2 -n 1 $port >srv.log 2>&1 &
  local sp=$!
  timeout 120 ./ksmc echo $3 10.1.0.1 $port "$BYTES" "$PINGS" >cli.log 2>&1
  local rc=$?
  timeout 10 sh -c "while kill -0 $sp 2>/dev/null; do sleep 0.1; done" || kill $sp 2>/dev/null
  wait $sp 2>/dev/null
  sed 's/^/  client: /' cli.log; sed 's/^/  server: /' srv.log
  check "$1" $rc
}

kernel_pairs() {
  log "kernel AF_SMC client -> kernel AF_SMC server (first contact: new link group)"
  # What the kernel puts on the wire (CLC on TCP, LLC/CDC in RoCEv2), kept
  # by the harness with KSMC_CAPTURE=DIR; vethA sees both directions.
  tcpdump -Z root -i vethA -s 400 -U -w first.pcap "udp port 4791 or tcp port $((port + 1))" 2>/dev/null &
  tp=$!
  sleep 1
  pair kernel-pair-first "" ""
  grep -q 'diag client .*mode=SMCR' cli.log; check kernel-pair-first-mode-SMCR $?
  sleep 1; kill $tp 2>/dev/null; wait $tp 2>/dev/null
  for r in $(seq 1 "${KSMC_RUNS:-3}"); do
    log "run $r: kernel SMC-R pair (link group reused)"
    pair kernel-pair-$r "" ""
    grep -q 'diag client .*mode=SMCR' cli.log; check kernel-pair-$r-mode-SMCR $?
    figure kernel-pair cli.log
    log "run $r: TCP pair"
    pair tcp-pair-$r -t -t
    figure tcp cli.log
  done

  log "plain TCP client -> kernel AF_SMC server: falls back (PEERNOSMC on the server)"
  pair kernel-server-tcp-client "" -t
  grep -q 'diag server .*mode=TCP fallback=0x03010000' srv.log; check kernel-server-fallback-PEERNOSMC $?

  log "kernel AF_SMC client -> plain TCP server: falls back (no SMC option in the SYN-ACK)"
  pair kernel-client-tcp-server -t ""
  grep -q 'diag client .*mode=TCP fallback=0x03010000' cli.log; check kernel-client-fallback-PEERNOSMC $?

  log "leftover AF_SMC sockets (smc_diag): none expected"
  sleep 1
  ./ksmc diag >diag.log; cat diag.log
  [ ! -s diag.log ]; check no-leftover-sockets $?
}
[ "${KSMC_GO_ONLY:-0}" = 1 ] || kernel_pairs

# The Go side's SMC option is a cgroup BPF program: cgroup v2 at its usual place.
mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup
lgrs_before=$(./ksmc lgrs)
for t in ${KSMC_GO_TESTS:-}; do
  log "go: $t"
  # KRCORE_SMC_TESTLINK: TestKernelGoKilled's kernel link test interval
  # (its default 30 s would add 25 s to the run; the test shows the
  # kernel's end follows it).
  KRCORE_SMC_VM=1 KRCORE_SMC_KSMC="$PWD/ksmc" KRCORE_SMC_TESTLINK=${KSMC_TESTLINK:-5} timeout 300 "./$t" -test.v -test.count=1 -test.timeout 240s -test.run 'Kernel' 2>&1 | tee go.log
  check "go-$t" "${PIPESTATUS[0]}"
  # The Go tests' own figure lines (go-server: a ksmc client against a Go
  # listener; go-client: a Go Dial against a ksmc server).
  sed -n 's/.*\(figure go-[a-z]* bulk_ms=[0-9.]* rtt_us=[0-9.]*\).*/\1/p' go.log >>figures.log
done

# The figures the issue asks for, as ratios (the VM is emulated: only
# ratios within this run mean anything), each name's runs averaged.
log "figures (1 MiB echo time, 8 B ping-pong round trip): ratios within this run"
awk '{ split($3, b, "="); split($4, r, "="); n[$2]++; ms[$2] += b[2]; rtt[$2] += r[2] }
  END {
    for (k in n) { ms[k] /= n[k]; rtt[k] /= n[k]; printf "  %-12s bulk %7.1f ms  rtt %8.1f us  (%d runs)\n", k, ms[k], rtt[k], n[k] }
    split("go-server go-client kernel-pair", who, " ")
    for (i = 1; i <= 3; i++) {
      w = who[i]; if (!(w in n)) continue
      for (j = 1; j <= 2; j++) {
        base = j == 1 ? "kernel-pair" : "tcp"
        if (base == w || !(base in n)) continue
        printf "ratio %s/%s rtt=%.2fx bulk=%.2fx\n", w, base, rtt[w] / rtt[base], ms[w] / ms[base]
      }
    }
  }' figures.log

log "after the Go tests: leftover AF_SMC sockets (none expected) and the kernel's link groups"
sleep 1
./ksmc diag >diag.log; cat diag.log
[ ! -s diag.log ]; check no-leftover-sockets-after-go $?
# The link groups the kernel made toward the Go side must be gone once the
# Go side closed its links (DELETE_LINK): as many as before the Go tests.
dmesg | grep -E 'smc: SMC-R lg .* (link added|link removed|state changed)' | tail -n 8
for i in $(seq 1 15); do
  now=$(./ksmc lgrs)
  [ "$now" = "$lgrs_before" ] && break
  sleep 1
done
echo "SMC-R link groups: before the Go tests $lgrs_before, after $now"
[ -n "$now" ] && [ "$now" = "$lgrs_before" ]; check go-link-groups-freed $?

log "done"
exit $fail
