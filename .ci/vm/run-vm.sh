#!/usr/bin/env bash
# run-vm.sh: run one command inside a throw-away qemu VM that boots
# Debian's stock kernel with kernel soft-RoCE (rdma_rxe): rxe0 on dummy0,
# 10.0.0.1/24. The repository's RDMA harnesses (.ci/rdma-vm.sh,
# .ci/rdma-interop.sh) run provider/ibverbs and krbench on it.
#
#   .ci/vm/run-vm.sh 'ibv_devinfo -v'        # a shell command line ...
#   .ci/vm/run-vm.sh ./prog -flag            # ... or argv, joined with spaces
#
# The command's stdout and stderr stream to stdout; the script exits with
# the command's status, 124 when the VM timed out, 125 when the VM itself
# could not be built or run.
#
# The guest has busybox, dash (/bin/sh), bash, iproute2 (ip, rdma),
# libibverbs with the rxe provider, ibverbs-utils and perftest. The host
# directory KRCORE_VM_SHARE (default: the current directory) is mounted
# read-write over 9p at the same path and is the working directory, so
# binaries built on the host (cgo, linked against libibverbs) run as they
# are; the shared libraries of the ELF files at its top level are copied in.
#
# Knobs (environment, all optional):
#   KRCORE_VM_CACHE    cache dir (default ${XDG_CACHE_HOME:-~/.cache}/krcore-vm)
#   KRCORE_VM_SHARE    host dir mounted in the guest (default $PWD)
#   KRCORE_VM_ACCEL    auto|kvm|tcg (auto: KVM when /dev/kvm is usable)
#   KRCORE_VM_SMP      vCPUs (default: host cores clamped to 2..4)
#   KRCORE_VM_MEM      guest RAM (default 1G)
#   KRCORE_VM_TIMEOUT  seconds before the VM is killed (default 900)
#   KRCORE_VM_VERBOSE=1  stream the guest's kernel console to stderr
#   KRCORE_VM_KERNEL_PKG  a Debian kernel package to boot instead of the
#                      pinned one (.ci/smc-vm.sh: 6.12, for SMC-R on rxe)
#   KRCORE_VM_EXTRA_MODS  more kernel modules to load at boot, with their
#                      dependencies (.ci/smc-vm.sh: veth smc smc_diag)
#   KRCORE_VM_EXTRA_BINS  more host programs to copy into the guest, with
#                      their libraries (.ci/smc-vm.sh: tcpdump)
#
# Nothing is installed on the host but Debian packages (apt-get); the
# kernel package is only downloaded and unpacked into the cache. The cache
# holds the unpacked kernel and the base initramfs; both are rebuilt when
# their inputs change (kernel package, host package versions, this file).
set -euo pipefail

CACHE="${KRCORE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/krcore-vm}"
SHARE="${KRCORE_VM_SHARE:-$PWD}"
ACCEL="${KRCORE_VM_ACCEL:-auto}"
# At least 2 vCPUs: with one, a polling client and server take turns at
# every scheduler tick (milliseconds per round trip).
ncpu=$(nproc); [ "$ncpu" -gt 4 ] && ncpu=4; [ "$ncpu" -lt 2 ] && ncpu=2
SMP="${KRCORE_VM_SMP:-$ncpu}"
MEM="${KRCORE_VM_MEM:-1G}"
TIMEOUT="${KRCORE_VM_TIMEOUT:-900}"
SELF=$(readlink -f "$0")
ARCHLIB=/usr/lib/x86_64-linux-gnu

log() { echo "[krcore-vm $(date +%T)] $*" >&2; }
die() { log "error: $*"; exit 125; }
[ $# -gt 0 ] || die "usage: $0 COMMAND [ARG...]"
start=$(date +%s)

mkdir -p "$CACHE"
# One builder at a time; the lock is let go before the VM boots, so runs
# that find the cache ready boot side by side.
exec 9>"$CACHE/.lock"
flock 9

# --- 1. host packages -------------------------------------------------------
# qemu to boot; busybox-static, rdma-core and friends are copied into the
# guest; kmod (depmod, modprobe --show-depends) resolves module order; cpio
# packs the initramfs; xz/zstd unpack the kernel and its modules; binutils'
# readelf finds the kernel's PVH entry.
HOST_PKGS="qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils
  perftest iproute2 kmod cpio xz-utils zstd binutils"
missing=""
for p in $HOST_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  apt-get update -qq >&2 || die "apt-get update failed"
  # Another apt on the machine holds the lock for a while: wait for it.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 $missing >&2 || die "apt-get install$missing failed"
fi

# --- 2. the kernel ----------------------------------------------------------
# The package linux-image-amd64 points at today; pinned in the cache so a
# later run does not fetch a new kernel behind the test's back (delete
# $CACHE/kernel-pkg to move on).
if [ -n "${KRCORE_VM_KERNEL_PKG:-}" ]; then
  kpkg=$KRCORE_VM_KERNEL_PKG
elif [ -s "$CACHE/kernel-pkg" ]; then
  kpkg=$(cat "$CACHE/kernel-pkg")
else
  kdep() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
  kpkg=$(kdep)
  if [ -z "$kpkg" ]; then apt-get update -qq >&2 || true; kpkg=$(kdep); fi
  [ -n "$kpkg" ] || die "cannot tell which kernel linux-image-amd64 depends on"
  echo "$kpkg" >"$CACHE/kernel-pkg"
fi
KROOT="$CACHE/$kpkg"
if [ ! -e "$KROOT/.done" ]; then
  log "downloading and unpacking $kpkg"
  rm -rf "$KROOT" "$CACHE/deb"; mkdir -p "$KROOT" "$CACHE/deb"
  ( cd "$CACHE/deb" && apt-get download -o APT::Sandbox::User=root "$kpkg" >&2 ) || die "apt-get download $kpkg failed"
  dpkg-deb -x "$CACHE"/deb/*.deb "$KROOT" || die "unpacking $kpkg failed"
  rm -rf "$CACHE/deb"
  [ -d "$KROOT/lib/modules" ] || ln -s usr/lib "$KROOT/lib"   # merged-/usr packages
  krel=$(ls "$KROOT/lib/modules" | head -n1)
  depmod -b "$KROOT" "$krel" || die "depmod failed"   # the package ships no modules.dep
  # Under TCG the compressed bzImage spends seconds decompressing itself.
  # Debian's kernel has a PVH entry point, which qemu boots straight from
  # the uncompressed ELF: unpack the payload once, keep it when it is one.
  vmlinuz="$KROOT/boot/vmlinuz-$krel"
  for m in 'xz:\xFD7zXZ\x00' 'zstd:\x28\xB5\x2F\xFD'; do
    off=$(LC_ALL=C grep -obUaP "${m#*:}" "$vmlinuz" | head -n1 | cut -d: -f1 || true)
    [ -n "$off" ] || continue
    tail -c +$((off + 1)) "$vmlinuz" | "${m%%:*}" -dcq >"$KROOT/vmlinux" 2>/dev/null || true
    break
  done
  readelf -n "$KROOT/vmlinux" 2>/dev/null | grep -qE 'Xen.*(0x00000012|PHYS32)' || rm -f "$KROOT/vmlinux"
  touch "$KROOT/.done"
fi
krel=$(ls "$KROOT/lib/modules" | head -n1)
KERNEL="$KROOT/boot/vmlinuz-$krel"
[ -s "$KROOT/vmlinux" ] && KERNEL="$KROOT/vmlinux"

# --- 3. the base initramfs --------------------------------------------------
# Guest programs (with their shared libraries, from the host's packages).
GUEST_BINS="/usr/bin/bash /usr/bin/dash /usr/bin/ip /usr/bin/rdma
  /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ibv_ud_pingpong
  /usr/bin/ib_read_lat /usr/bin/ib_write_lat /usr/bin/ib_send_lat /usr/bin/ib_read_bw
  /usr/bin/ib_write_bw /usr/bin/ib_send_bw /usr/bin/ib_atomic_lat
  $ARCHLIB/libibverbs.so.1 $ARCHLIB/libgcc_s.so.1 ${KRCORE_VM_EXTRA_BINS:-}"
# Kernel modules, dependencies first. rxe's CRC comes through the crypto
# API, which would load crc32 with request_module(), and the guest has no
# modprobe: name it. Built-in ones are skipped.
GUEST_MODS="crc32_generic crc32_pclmul rdma_rxe ib_uverbs dummy virtio_pci 9pnet_virtio 9p
  ${KRCORE_VM_EXTRA_MODS:-}"

INITRD="$CACHE/initramfs-$krel.cpio"
stamp() {
  echo "$kpkg $GUEST_BINS $GUEST_MODS"; cat "$SELF" "$(dirname "$SELF")/init" | md5sum
  dpkg-query -W busybox-static rdma-core ibverbs-providers ibverbs-utils perftest iproute2 bash dash libc6
}
if [ ! -s "$INITRD" ] || [ "$(cat "$INITRD.stamp" 2>/dev/null)" != "$(stamp)" ]; then
  log "building the initramfs for $krel"
  R="$CACHE/root"
  rm -rf "$R"
  mkdir -p "$R"/usr/{bin,sbin,lib64} "$R$ARCHLIB" "$R"/{dev,proc,sys,tmp,run,etc,root}
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$R/$d"; done
  cp /bin/busybox "$R/usr/bin/"
  for a in $(/bin/busybox --list); do [ -e "$R/usr/bin/$a" ] || ln -s busybox "$R/usr/bin/$a"; done
  # Debian's busybox runs its own applets before PATH inside `busybox sh`
  # (iproute2's ip would lose to busybox's): /bin/sh is dash.
  ln -sf dash "$R/usr/bin/sh"
  for f in $GUEST_BINS; do
    [ -e "$f" ] || die "$f missing on the host"
    mkdir -p "$R$(dirname "$f")"; rm -f "$R$f"; cp -L "$f" "$R$f"
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r lib; do
      [ -e "$R$lib" ] || { mkdir -p "$R$(dirname "$lib")"; cp -L "$lib" "$R$lib"; }
    done
  done
  # libibverbs finds its providers through /etc/libibverbs.d; only rxe.
  mkdir -p "$R/etc/libibverbs.d" "$R$ARCHLIB/libibverbs"
  cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
  cp -L "$ARCHLIB"/libibverbs/librxe-rdmav*.so "$R$ARCHLIB/libibverbs/"
  # Modules, decompressed (busybox insmod takes plain .ko), in load order.
  M="$R/lib/modules/$krel"
  mkdir -p "$M"; : >"$R/etc/modules"
  for m in $GUEST_MODS; do
    # A module this kernel lacks is skipped; rdma_rxe is checked below.
    { modprobe -d "$KROOT" -S "$krel" --show-depends "$m" 2>/dev/null || true; } | awk '$1=="insmod"{print $2}' |
      while read -r ko; do
        base=$(basename "$ko"); base=${base%.xz}; base=${base%.zst}
        grep -qxF "$base" "$R/etc/modules" && continue
        case "$ko" in
          *.xz) xz -dc "$ko" >"$M/$base" ;;
          *.zst) zstd -qdc "$ko" >"$M/$base" ;;
          *) cp "$ko" "$M/$base" ;;
        esac
        echo "$base" >>"$R/etc/modules"
      done
  done
  grep -qx rdma_rxe.ko "$R/etc/modules" || die "rdma_rxe not found in $kpkg"
  echo "root:x:0:0:root:/root:/bin/sh" >"$R/etc/passwd"
  echo "root:x:0:" >"$R/etc/group"
  printf '127.0.0.1 localhost\n10.0.0.1 vm\n' >"$R/etc/hosts"
  cp "$(dirname "$SELF")/init" "$R/init"; chmod +x "$R/init"
  ( cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet ) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  stamp >"$INITRD.stamp"
  log "initramfs: $(du -h "$INITRD" | cut -f1), $(wc -l <"$R/etc/modules") modules"
fi

# --- 4. this run: the command, the share, extra libraries ---------------------
# A second cpio appended to the base one: the kernel unpacks both.
RUN=$(mktemp -d "$CACHE/run.XXXXXX")
QPID=""
trap '[ -n "$QPID" ] && kill "$QPID" 2>/dev/null; rm -rf "$RUN"' EXIT
trap 'exit 130' INT TERM
SHARE=$(cd "$SHARE" && pwd -P)
mkdir -p "$RUN/ov/etc"
printf '%s\n' "$*" >"$RUN/ov/etc/vm.cmd"
printf 'VM_SHARE=%q\n' "$SHARE" >"$RUN/ov/etc/vm.env"
# Host-built programs at the share's top level may need libraries the base
# lacks (a cgo binary's libc is the host's, as is its libibverbs).
find "$SHARE" -maxdepth 1 -type f -perm -u+x | while read -r f; do
  [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || continue
  # A static program has none (ldd fails).
  { ldd "$f" 2>/dev/null || true; } | awk '/=> \//{print $3}' | while read -r lib; do
    [ -e "$CACHE/root$lib" ] || [ -e "$RUN/ov$lib" ] && continue
    mkdir -p "$RUN/ov$(dirname "$lib")"; cp -L "$lib" "$RUN/ov$lib"
  done
done
( cd "$RUN/ov" && find . -mindepth 1 | cpio -o -H newc --quiet ) >"$RUN/ov.cpio"
cat "$INITRD" "$RUN/ov.cpio" >"$RUN/initrd"
flock -u 9; exec 9>&-

# --- 5. boot ----------------------------------------------------------------
kvm_usable() {
  [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  # A PVM host (kvm_pvm) offers /dev/kvm but runs only PVM guest kernels.
  [ ! -d /sys/module/kvm_pvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo
}
case "$ACCEL" in
  auto) if kvm_usable; then accel=kvm; else accel=tcg; fi ;;
  kvm|tcg) accel=$ACCEL ;;
  *) die "KRCORE_VM_ACCEL must be auto, kvm or tcg" ;;
esac
# ttyS0: the kernel console; ttyS1: the command's output; ttyS2: its status.
boot() {
  local acc
  if [ "$1" = kvm ]; then acc=(-accel kvm -cpu host); else acc=(-accel tcg,thread=multi -cpu max); fi
  : >"$RUN/out"; : >"$RUN/console"; : >"$RUN/rc"
  log "booting $krel ($1, $SMP vCPUs, $MEM)"
  timeout -k 5 "$TIMEOUT" qemu-system-x86_64 -machine q35 "${acc[@]}" -smp "$SMP" -m "$MEM" \
    -nodefaults -no-user-config -display none -no-reboot -monitor none \
    -kernel "$KERNEL" -initrd "$RUN/initrd" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off tsc=reliable" \
    -serial "file:$RUN/console" -serial "file:$RUN/out" -serial "file:$RUN/rc" \
    -fsdev "local,id=fs0,path=$SHARE,security_model=none" \
    -device virtio-9p-pci,fsdev=fs0,mount_tag=share \
    </dev/null >"$RUN/qemu.log" 2>&1 &
  QPID=$!
  tail -n +1 -s 0.2 -f --pid=$QPID "$RUN/out" &
  local tpid=$!
  [ "${KRCORE_VM_VERBOSE:-0}" = 1 ] && tail -n +1 -s 0.2 -f --pid=$QPID "$RUN/console" >&2 &
  qrc=0; wait $QPID || qrc=$?
  QPID=""
  wait $tpid 2>/dev/null || true
}
boot "$accel"
if [ "$accel" = kvm ] && [ "$ACCEL" = auto ] && [ ! -s "$RUN/rc" ] && [ ! -s "$RUN/out" ] &&
   [ "$qrc" != 124 ] && [ "$qrc" != 137 ]; then
  # Nested hosts where qemu's -cpu host fails at once: emulate instead.
  log "KVM boot failed (qemu exit $qrc: $(tail -n1 "$RUN/qemu.log")); retrying under TCG"
  boot tcg
fi

# --- 6. the outcome -----------------------------------------------------------
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  log "the VM timed out after ${TIMEOUT}s; its console:"; tail -n 40 "$RUN/console" >&2
  exit 124
fi
rc=$(tr -dc '0-9' <"$RUN/rc")
if [ -z "$rc" ]; then
  log "the VM gave no exit status (qemu exit $qrc); console and qemu output:"
  cat "$RUN/console" "$RUN/qemu.log" >&2
  exit 125
fi
if grep -qE 'Call Trace|BUG:|Oops' "$RUN/console"; then
  log "the guest kernel reported a problem:"; grep -E -A3 'Call Trace|BUG:|Oops' "$RUN/console" | head -n 40 >&2
elif [ "$rc" != 0 ]; then
  log "guest kernel log (tail):"; tail -n 25 "$RUN/console" >&2
fi
log "exit status $rc after $(( $(date +%s) - start ))s"
exit "$rc"
