# rdma-host.sh: sourced by rdma-vm.sh and rdma-interop.sh. Sets VM to the
# repository's VM runner (.ci/vm/run-vm.sh, which installs the packages it
# needs to build and boot the VM itself) and installs what the cgo build
# with -tags rdma needs: a C compiler and libibverbs-dev. $1 names the
# caller in messages.

export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
VM="$(pwd)/.ci/vm/run-vm.sh"

missing=""
for p in gcc libc6-dev pkg-config libibverbs-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== $1: apt-get install$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 $missing >/dev/null
fi
