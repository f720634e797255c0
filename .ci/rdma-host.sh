# rdma-host.sh: sourced by rdma-vm.sh and rdma-interop.sh. Sets VM to the
# shared VM runner and installs the host packages both need: a C compiler
# and libibverbs-dev for the cgo build, and what run-rdma-vm.sh needs to
# assemble and boot the VM (it would install the same list itself; doing it
# here keeps its output short). $1 names the caller in messages.

export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
VM="$(pwd)/../shared/rdma-vm/run-rdma-vm.sh"
if [ ! -f "$VM" ]; then
  echo "$1: $VM not found (clone the repository next to shared/)" >&2
  exit 1
fi

pkgs="gcc libc6-dev pkg-config libibverbs-dev qemu-system-x86 busybox-static rdma-core
  ibverbs-providers ibverbs-utils rdmacm-utils perftest librdmacm-dev iproute2 kmod cpio
  xz-utils zstd python3 binutils"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== apt-get install$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
