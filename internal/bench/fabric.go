package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/krcore/krcore/internal/bench/flags"
	"github.com/krcore/krcore/internal/bench/pingpong"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// fabric makes the RNICs a run uses: soft RNIC nodes, or a real device
// through libibverbs. It is the only place krbench names a provider;
// everything else speaks verbs.
type fabric interface {
	// newNode starts a node for one side ("client", "server").
	newNode(side string) (verbs.Device, error)
	// placement describes where the two sides are, for table headers. It
	// also names the provider when that is not soft, so a client and a
	// server on different providers refuse each other at hello.
	placement() string
	// transport names the RC transport in table preambles.
	transport() string
	// describe says what dev is, for the Fabric line of tables.
	describe(dev verbs.Device) string
}

// Providers -provider accepts.
const (
	providerSoft    = "soft"
	providerIBVerbs = "ibverbs"
)

// tcpFabric nodes listen on a TCP address: peers on other hosts reach them
// over the soft fabric's wire protocol, peers in other processes of this
// host by its shared-memory link, unless tcpOnly (-link tcp) keeps those on
// TCP too.
type tcpFabric struct {
	listen  string
	tcpOnly bool
}

// How -link has soft RNICs in two processes of one host talk.
const (
	linkShm = "shm"
	linkTCP = "tcp"
)

func newTCPFabric(cfg *config) tcpFabric {
	return tcpFabric{listen: cfg.fabricAddr, tcpOnly: cfg.link == linkTCP}
}

func (f tcpFabric) newNode(side string) (verbs.Device, error) {
	n, err := soft.NewNode(soft.Config{Listen: f.listen, TCPOnly: f.tcpOnly})
	if err != nil {
		return nil, fmt.Errorf("start %s soft RNIC on %s: %w", side, f.listen, err)
	}
	return n, nil
}

// placement is placementCross on the shared-memory link (what two
// processes of one host use), placementCrossTCP on the forced TCP link.
func (f tcpFabric) placement() string {
	if f.tcpOnly {
		return placementCrossTCP
	}
	return placementCross
}

func (f tcpFabric) transport() string {
	if f.tcpOnly {
		return "soft RC, TCP link"
	}
	return "soft RC, shared-memory link on one host"
}

func (tcpFabric) describe(dev verbs.Device) string { return "soft RNIC " + dev.Port().Addr }

// memFabric nodes share one in-memory wire: both sides in this process.
type memFabric struct{ fab *soft.Fabric }

func newMemFabric() memFabric { return memFabric{fab: soft.NewFabric()} }

func (f memFabric) newNode(side string) (verbs.Device, error) {
	n, err := f.fab.NewNode(soft.Config{})
	if err != nil {
		return nil, fmt.Errorf("start %s in-memory soft RNIC: %w", side, err)
	}
	return n, nil
}

func (memFabric) placement() string { return placementInproc }

func (memFabric) transport() string { return "soft RC" }

func (memFabric) describe(dev verbs.Device) string { return "soft RNIC " + dev.Port().Addr }

// ibvFabric opens a real RDMA device through libibverbs for each side
// (ibverbs.Open; a build without -tags rdma fails with the provider's
// "built without rdma support" error). Both sides may be on one host and
// even one device (two processes on rxe0), or on two hosts.
type ibvFabric struct {
	ctx    context.Context
	dev    string
	port   int
	gidIdx int
}

func (f ibvFabric) newNode(side string) (verbs.Device, error) {
	d, err := ibverbs.Open(f.ctx, f.dev, f.port, f.gidIdx)
	if err != nil {
		name := f.dev
		if name == "" {
			name = "the first RDMA device"
		}
		return nil, fmt.Errorf("open %s for the %s side: %w", name, side, err)
	}
	return d, nil
}

func (ibvFabric) placement() string { return placementIBVerbs }

func (ibvFabric) transport() string { return "ibverbs RC" }

func (ibvFabric) describe(dev verbs.Device) string {
	p := dev.Port()
	return fmt.Sprintf("%s port %d GID[%d] %s", dev.Name(), p.Num, p.GIDIndex, pingpong.NtopGID(p.GID))
}

// fabricFor is the fabric a -server or -client run uses.
func (cfg *config) fabricFor(ctx context.Context) fabric {
	if cfg.provider == providerIBVerbs {
		return ibvFabric{ctx: ctx, dev: cfg.ibDev, port: cfg.ibPort, gidIdx: cfg.gidIdx}
	}
	return newTCPFabric(cfg)
}

// ibverbsTests are what a run on the ibverbs provider can do: the raw
// verbs tests, the TCP baseline, and the KRCore runtime's connect and vq
// tests, which run in its RC-only mode (the provider has no DC: mlx5dv is
// not bound); cluster and mesh run on in-process soft nodes whatever the
// provider, so they run only when named.
var ibverbsTests = []string{testRaw, testRead, testWrite, testSend, testAtomic, testConnect, testVQ}

// applyProvider checks -provider and its flags and drops the tests the
// provider cannot run. specs are the test words of the command line.
func (cfg *config) applyProvider(set map[string]bool, specs []string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", flags.ErrUsage, fmt.Sprintf(format, a...))
	}
	switch cfg.provider {
	case providerSoft:
		for _, f := range []string{"ib-dev", "ib-port", "gid-idx"} {
			if set[f] {
				return bad("-%s is for -provider ibverbs", f)
			}
		}
		return nil
	case providerIBVerbs:
	default:
		return bad("-provider %q: want soft or ibverbs", cfg.provider)
	}
	if !ibverbs.Built {
		return fmt.Errorf("%w: -provider ibverbs: %w", flags.ErrUsage, ibverbs.ErrNotBuilt)
	}
	switch {
	case cfg.role == roleInproc || cfg.role == roleDemo:
		return bad("-provider ibverbs runs between a -server and a -client process (demo and -inproc use the soft fabric)")
	case set["fabric-addr"]:
		return bad("-fabric-addr is the soft RNIC's; an ibverbs device has its own address")
	case cfg.ibPort < 1:
		return bad("-ib-port %d: ports count from 1", cfg.ibPort)
	case cfg.gidIdx < -1:
		return bad("-gid-idx %d: want an index, or -1 to let the provider choose", cfg.gidIdx)
	}
	all := len(specs) == 0
	for _, s := range specs {
		name := strings.ToLower(strings.TrimSpace(s))
		if k := strings.LastIndexAny(name, "-_"); k > 0 && (name[k+1:] == modeLat || name[k+1:] == modeBW) {
			name = name[:k]
		}
		switch name {
		case "all":
			all = true
		case "krcore", "runtime":
			return bad("test %q runs in-process clusters of soft RNICs: use -provider soft (or name connect and vq)", s)
		}
	}
	cfg.tests = slices.DeleteFunc(cfg.tests, func(t string) bool {
		if slices.Contains(ibverbsTests, t) {
			return false
		}
		return all // cluster, mesh: only when named
	})
	if len(cfg.tests) == 0 {
		return bad("no test left that provider ibverbs runs (read, write, send, atomic, connect, vq, raw)")
	}
	return nil
}

// Placements, as printed in table headers and used in check names.
const (
	placementCross = "cross-process"
	// placementCrossTCP is two processes whose soft RNICs talk over TCP
	// (-link tcp), as two hosts' do.
	placementCrossTCP = "cross-process tcp-link"
	placementInproc   = "in-process"
	// placementIBVerbs is two processes on real verbs (libibverbs). The
	// soft fabric's targets are not judged on it.
	placementIBVerbs = "cross-process ibverbs"
)
