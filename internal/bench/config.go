package bench

import (
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/internal/bench/flags"
)

// defaultPort is perftest's default port.
const defaultPort = 18515

// Test names.
const (
	testRaw     = "raw"
	testRead    = "read"
	testWrite   = "write"
	testSend    = "send"
	testAtomic  = "atomic"
	testConnect = "connect"
	testVQ      = "vq"      // KRCore data plane: VQ vs raw QP, same nodes, interleaved
	testMesh    = "mesh"    // full-mesh creation, KRCore vs raw RC (in this process)
	testCluster = "cluster" // the runtime walkthrough (in this process)
)

// allTests is the order tests run in: the TCP baseline first so the ratios
// have their denominators, then the runtime walkthrough, the raw verbs
// tests, and the KRCore comparisons (connect churns QPs, so it comes after
// the data-plane tests of raw verbs).
var allTests = []string{testRaw, testCluster, testRead, testWrite, testSend, testAtomic, testConnect, testVQ, testMesh}

// localTests use no server: they start their own in-process cluster on an
// in-memory fabric, whatever the placement of the run.
var localTests = []string{testCluster, testMesh, testImm}

// namedTests run only when named, after allTests: not part of all.
var namedTests = []string{testImm}

// Modes.
const (
	modeLat = "lat"
	modeBW  = "bw"
)

// Roles: what a command line runs.
const (
	roleNone role = iota
	roleServer
	roleClient
	roleInproc
	roleDemo
)

// Default busy-poll budgets. On these 2-core machines a cross-process run
// has two processes whose fabric link readers each need a core when a
// response arrives; a spinning poller takes one of the two, and measured
// latencies got 2-4x worse and erratic (krbench -spin 50us vs -spin 0). In
// one process the in-memory wire completes READ/WRITE/atomics inside
// PostSend and a short spin keeps the SEND echo off the scheduler.
//
// On ibverbs there is no link reader: the device completes requests by
// itself, so the poller spins as perftest does (for up to spinIBVerbs per
// wait, then blocks on the completion channel).
const (
	spinCross   = 0
	spinInproc  = 200 * time.Microsecond
	spinIBVerbs = 100 * time.Millisecond
)

// maxSize is the largest message -a runs.
const maxSize = 8 << 20

// maxNodes bounds -nodes: every node is a soft RNIC and a runtime in this
// process, and a mesh has nodes*(nodes-1) connections.
const maxNodes = 64

// Byte budgets that bound the default iteration counts, so -a finishes in
// reasonable time on the soft fabric.
const (
	latBudget = 256 << 20
	bwBudget  = 512 << 20
)

// isLocal reports whether test needs no server.
func isLocal(test string) bool { return slices.Contains(localTests, test) }

// usesBaseline reports whether test's figures are divided by the TCP
// baseline (the raw verbs data-plane tests).
func usesBaseline(test string) bool {
	switch test {
	case testRead, testWrite, testSend, testAtomic:
		return true
	}
	return false
}

// role is what this invocation does.
type role int

// config is the parsed command line.
type config struct {
	role       role
	server     string // -client HOST:PORT
	bind       string
	port       int
	fabricAddr string
	// link (-link): how this side's soft RNIC reaches one in another
	// process of this host: linkShm (shared memory) or linkTCP (forced).
	link string
	once bool
	// keepRuntime (-keep-runtime, server): one KRCore runtime for every
	// session, started at startup; its MetaServer is printed for krcored.
	keepRuntime bool
	// daemon (-daemon SOCKET, client): the connect and vq tests' runtime
	// is the krcored at SOCKET instead of one embedded in this process.
	daemon string

	provider string // -provider: soft or ibverbs
	ibDev    string // -ib-dev: ibverbs device ("" the first)
	ibPort   int    // -ib-port
	gidIdx   int    // -gid-idx: -1 lets the provider choose

	tests    []string            // in allTests order
	modes    map[string][]string // per test: lat, bw
	size     int                 // 0: the mode's default
	all      bool                // -a
	n        int                 // -n; 0: size-dependent default
	txDepth  int
	cqMod    int
	rxDepth  int
	inline   int // -1: automatic
	atomicOp string
	spin     time.Duration
	timeout  time.Duration
	idle     time.Duration
	json     bool
	baseline bool
	check    bool
	verbose  bool
	nodes    int // -nodes: cluster and mesh size

	cpuProfile string // -cpuprofile: pprof CPU profile of this process
	traceFile  string // -trace: runtime execution trace of this process
}

// usageText is what krbench -h prints before the flags.
const usageText = `usage:
  krbench demo [flags]                   runtime walkthrough, server as a child process, full suite, ratios
  krbench -server [-port N] [-once]      serve clients one at a time
  krbench -client HOST[:PORT] [flags]    run tests against a server
  krbench -inproc [flags]                both sides in this process (in-memory fabric)
  krbench pingpong [flags] [HOST]        ibv_rc_pingpong on real verbs (krbench pingpong -h)

providers: -provider soft (default) or ibverbs (a build with -tags rdma; -ib-dev, -ib-port, -gid-idx)

through krcored: krbench -server -keep-runtime prints "krbench server meta: INFO"; start
  krcored -meta "INFO" -socket S on the client's host, then krbench -client HOST -daemon S connect vq:
  the KRCore side of connect and vq goes through the daemon (rows *_daemon), the raw side stays here

tests: -test LIST or words after the flags: read write send atomic connect vq mesh cluster raw all,
       optionally with a mode: read-lat, write_bw, vq-lat ... (perftest names);
       krcore = cluster,connect,vq,mesh (the KRCore runtime vs raw verbs)
examples:
  krbench -client 10.0.0.1 -test read -mode lat -s 8 -n 10000
  krbench -client 10.0.0.1 write-bw -a
  krbench -inproc read-lat --json
  krbench -client 10.0.0.1 connect vq    # KRCore connects and VQ data plane vs raw RC, across hosts
  krbench -inproc mesh -nodes 16         # full-mesh creation, KRCore vs raw RC

flags:
`

// parseArgs reads the command line. Words that are not flags select the
// role (demo, server, client HOST, inproc) or tests (read-lat, all ...);
// they may come before or after the flags.
func parseArgs(args []string, stderr io.Writer) (*config, error) {
	cfg := &config{}
	fs := flags.NewSet("krbench", usageText, stderr)
	var (
		server, inproc, local bool
		client, testList      string
		modeList              string
	)
	fs.BoolVar(&server, "server", false, "run the server side")
	fs.StringVar(&client, "client", "", "run the client side against `HOST[:PORT]`")
	fs.BoolVar(&inproc, "inproc", false, "run both sides in this process on the in-memory fabric")
	fs.BoolVar(&local, "local", false, "same as the demo command: start a server child process and run the client against it")
	fs.IntVar(&cfg.port, "port", defaultPort, "server control port (0 picks one and prints it)")
	fs.StringVar(&cfg.bind, "bind", "127.0.0.1", "server: address to listen on (0.0.0.0 for other hosts, with -fabric-addr)")
	fs.StringVar(&cfg.fabricAddr, "fabric-addr", "127.0.0.1:0", "TCP address this side's soft RNIC listens on")
	fs.StringVar(&cfg.link, "link", linkShm, "soft: how the two sides' RNICs talk when on one host: shm (shared memory) or tcp (forced, as between hosts); both sides must agree")
	fs.StringVar(&cfg.provider, "provider", providerSoft, "RDMA provider: soft (pure Go, runs anywhere) or ibverbs (libibverbs; a build with -tags rdma)")
	fs.StringVar(&cfg.ibDev, "ib-dev", "", "ibverbs: RDMA `device` (default the first, as ibv_devices lists them)")
	fs.IntVar(&cfg.ibPort, "ib-port", 1, "ibverbs: device port")
	fs.IntVar(&cfg.gidIdx, "gid-idx", -1, "ibverbs: GID table `index` (-1: a RoCE v2 IPv4-mapped GID if there is one)")
	fs.BoolVar(&cfg.once, "once", false, "server: exit after the first client")
	fs.BoolVar(&cfg.keepRuntime, "keep-runtime", false, "server: start the KRCore runtime at startup, keep it for every client, and print its MetaServer (\""+strings.TrimSpace(metaPrefix)+" ...\") for krcored's -meta")
	fs.StringVar(&cfg.daemon, "daemon", "", "client: run the connect and vq tests' KRCore side through the krcored at `SOCKET` (joined to a -keep-runtime server's MetaServer)")
	fs.StringVar(&testList, "test", "", "tests: read,write,send,atomic,connect,vq,mesh,cluster,raw,all (default all)")
	fs.StringVar(&modeList, "mode", "", "modes: lat,bw (default both)")
	fs.IntVar(&cfg.size, "s", 0, "message size in bytes (default 8 for lat, 65536 for bw)")
	fs.BoolVar(&cfg.all, "a", false, "run every size from 2 B to 8 MiB (powers of two)")
	fs.IntVar(&cfg.n, "n", 0, "iterations per size (default 1000 lat, 5000 bw, 100 RC connect, 20 mesh; fewer for large sizes)")
	fs.IntVar(&cfg.nodes, "nodes", 8, "mesh, cluster: number of nodes of the in-process cluster")
	fs.IntVar(&cfg.txDepth, "tx-depth", 128, "bw: requests in flight")
	fs.IntVar(&cfg.cqMod, "cq-mod", 32, "bw: signal one request in this many")
	fs.IntVar(&cfg.rxDepth, "rx-depth", 512, "send: receives kept posted")
	fs.IntVar(&cfg.inline, "inline", -1, "send/write payloads up to this size go inline (-1: up to 220 B, as perftest)")
	fs.StringVar(&cfg.atomicOp, "atomic-op", "fadd", "atomic operation: fadd or cas")
	fs.DurationVar(&cfg.spin, "spin", -1, "busy-poll the CQ this long before blocking; 0 always blocks (default: 0 across processes, 200us in one process)")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Second, "bound on every wait for a completion or the peer")
	fs.DurationVar(&cfg.idle, "idle", 2*time.Minute, "server: drop a client silent this long")
	fs.BoolVar(&cfg.json, "json", false, "print one JSON report instead of tables")
	fs.BoolVar(&cfg.baseline, "baseline", false, "also run the raw TCP baseline and print ratios (default with -test all)")
	fs.BoolVar(&cfg.check, "check", false, "exit with status 3 if a target is missed")
	fs.BoolVar(&cfg.verbose, "v", false, "log progress to stderr")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write this process's CPU profile to `file` (go tool pprof)")
	fs.StringVar(&cfg.traceFile, "trace", "", "write this process's execution trace to `file` (go tool trace): shows scheduler delays")

	words, err := flags.ParseMixed(fs, args, func(a string) bool { return !strings.HasPrefix(a, "-") })
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var specs []string
	if testList != "" {
		specs = append(specs, strings.Split(testList, ",")...)
	}
	for i := 0; i < len(words); i++ {
		switch w := strings.ToLower(words[i]); w {
		case "demo", "local":
			local = true
		case "server":
			server = true
		case "inproc":
			inproc = true
		case "client":
			if i+1 >= len(words) || client != "" {
				return nil, fmt.Errorf("%w: \"client\" needs one HOST[:PORT]", flags.ErrUsage)
			}
			i++
			client = words[i]
		default:
			specs = append(specs, w)
		}
	}

	n := 0
	for _, b := range []bool{server, client != "", inproc, local} {
		if b {
			n++
		}
	}
	switch {
	case n == 0:
		return nil, fmt.Errorf("%w: say what to run: demo, -server, -client HOST or -inproc", flags.ErrUsage)
	case n > 1:
		return nil, fmt.Errorf("%w: pick one of demo, -server, -client and -inproc", flags.ErrUsage)
	case server:
		cfg.role = roleServer
	case client != "":
		cfg.role = roleClient
		addr, err := serverAddr(client)
		if err != nil {
			return nil, err
		}
		cfg.server = addr
	case inproc:
		cfg.role = roleInproc
	default:
		cfg.role = roleDemo
	}
	if cfg.role == roleServer && len(specs) > 0 {
		return nil, fmt.Errorf("%w: the server runs whatever its clients ask; tests %q belong on the client", flags.ErrUsage, specs)
	}

	tests, modes, err := parseSpecs(specs, modeList)
	if err != nil {
		return nil, err
	}
	cfg.tests, cfg.modes = tests, modes
	if err := cfg.applyProvider(set, specs); err != nil {
		return nil, err
	}
	if (len(specs) == 0 || slices.Contains(specs, "all")) && !set["baseline"] {
		cfg.baseline = true
	}
	if cfg.baseline {
		cfg.addBaseline()
	}
	if cfg.role == roleInproc && !set["baseline"] && !slices.Contains(specs, testRaw) {
		// A TCP baseline between two goroutines of one process says little
		// about the in-memory wire; run it only when asked for.
		cfg.tests = slices.DeleteFunc(cfg.tests, func(t string) bool { return t == testRaw })
		cfg.baseline = false
	}
	return cfg, validate(cfg, set)
}

// serverAddr adds the default port to HOST.
func serverAddr(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty -client address", flags.ErrUsage)
	}
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s, nil
	}
	host := strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return "", fmt.Errorf("%w: bad -client address %q (want HOST or HOST:PORT)", flags.ErrUsage, s)
	}
	return net.JoinHostPort(host, strconv.Itoa(defaultPort)), nil
}

// parseSpecs turns test words (read, read-lat, write_bw, all) and the -mode
// list into the tests to run, in allTests order, and each test's modes. A
// word with a mode runs only that mode (read-lat); one without runs the
// -mode list (default both).
func parseSpecs(specs []string, modeList string) ([]string, map[string][]string, error) {
	global := map[string]bool{}
	if modeList != "" {
		for _, m := range strings.Split(modeList, ",") {
			switch m = strings.TrimSpace(strings.ToLower(m)); m {
			case modeLat, modeBW:
				global[m] = true
			case "both", "all":
				global[modeLat], global[modeBW] = true, true
			default:
				return nil, nil, fmt.Errorf("%w: unknown mode %q (want lat or bw)", flags.ErrUsage, m)
			}
		}
	}
	if len(global) == 0 {
		global[modeLat], global[modeBW] = true, true
	}
	want := map[string]map[string]bool{} // test -> modes
	add := func(test, mode string) {
		if want[test] == nil {
			want[test] = map[string]bool{}
		}
		if mode != "" {
			want[test][mode] = true
			return
		}
		for m := range global {
			want[test][m] = true
		}
	}
	for _, s := range specs {
		s = strings.TrimSpace(strings.ToLower(s))
		if s == "" {
			continue
		}
		name, mode := s, ""
		if k := strings.LastIndexAny(s, "-_"); k > 0 {
			if m := s[k+1:]; m == modeLat || m == modeBW {
				name, mode = s[:k], m
			}
		}
		switch name {
		case "all":
			for _, t := range allTests {
				add(t, mode)
			}
		case testRaw, "tcp":
			add(testRaw, mode)
		case testRead, testWrite, testSend, testAtomic, testConnect, testVQ, testMesh, testCluster, testImm:
			add(name, mode)
		case "krcore", "runtime":
			for _, t := range []string{testCluster, testConnect, testVQ, testMesh} {
				add(t, mode)
			}
		default:
			return nil, nil, fmt.Errorf("%w: unknown test %q (want read, write, send, atomic, connect, vq, mesh, cluster, imm, krcore, raw or all)", flags.ErrUsage, s)
		}
	}
	if len(want) == 0 {
		for _, t := range allTests {
			add(t, "")
		}
	}
	var tests []string
	modes := map[string][]string{}
	for _, t := range slices.Concat(allTests, namedTests) {
		if want[t] == nil {
			continue
		}
		tests = append(tests, t)
		for _, m := range []string{modeLat, modeBW} {
			if want[t][m] {
				modes[t] = append(modes[t], m)
			}
		}
	}
	return tests, modes, nil
}

// modesOf lists the modes a test runs in.
func (cfg *config) modesOf(test string) []string { return cfg.modes[test] }

// addBaseline adds the raw TCP test in every mode some RDMA test runs,
// so each figure has a denominator.
func (cfg *config) addBaseline() {
	lat, bw := false, false
	for _, t := range cfg.tests {
		if !usesBaseline(t) {
			continue
		}
		lat = lat || slices.Contains(cfg.modes[t], modeLat)
		bw = bw || slices.Contains(cfg.modes[t], modeBW)
	}
	var m []string
	for _, x := range cfg.modes[testRaw] {
		switch x {
		case modeLat:
			lat = true
		case modeBW:
			bw = true
		}
	}
	if lat {
		m = append(m, modeLat)
	}
	if bw {
		m = append(m, modeBW)
	}
	if len(m) == 0 {
		return
	}
	if !slices.Contains(cfg.tests, testRaw) {
		cfg.tests = append([]string{testRaw}, cfg.tests...)
	}
	cfg.modes[testRaw] = m
}

// spinFor is the busy-poll budget for a placement: -spin if given.
func (cfg *config) spinFor(placement string) time.Duration {
	switch {
	case cfg.spin >= 0:
		return cfg.spin
	case placement == placementInproc:
		return spinInproc
	case placement == placementIBVerbs:
		return spinIBVerbs
	}
	return spinCross
}

func validate(cfg *config, set map[string]bool) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", flags.ErrUsage, fmt.Sprintf(format, a...))
	}
	switch {
	case cfg.port < 0 || cfg.port > 65535:
		return bad("-port %d out of range", cfg.port)
	case set["s"] && (cfg.size < 1 || cfg.size > maxSize):
		return bad("-s %d: want 1..%d", cfg.size, maxSize)
	case set["s"] && cfg.all:
		return bad("-s and -a exclude each other")
	case set["n"] && cfg.n < 1:
		return bad("-n %d: want at least 1", cfg.n)
	case cfg.txDepth < 1 || cfg.txDepth > 4096:
		return bad("-tx-depth %d: want 1..4096", cfg.txDepth)
	case cfg.cqMod < 1:
		return bad("-cq-mod %d: want at least 1", cfg.cqMod)
	case cfg.rxDepth < 1 || cfg.rxDepth > 8192:
		return bad("-rx-depth %d: want 1..8192", cfg.rxDepth)
	case cfg.atomicOp != "fadd" && cfg.atomicOp != "cas":
		return bad("-atomic-op %q: want fadd or cas", cfg.atomicOp)
	case cfg.spin < 0 && set["spin"]:
		return bad("-spin %v is negative", cfg.spin)
	case cfg.timeout <= 0:
		return bad("-timeout %v: want a positive duration", cfg.timeout)
	case cfg.idle <= 0:
		return bad("-idle %v: want a positive duration", cfg.idle)
	case cfg.nodes < 2 || cfg.nodes > maxNodes:
		return bad("-nodes %d: want 2..%d", cfg.nodes, maxNodes)
	case set["keep-runtime"] && cfg.role != roleServer:
		return bad("-keep-runtime is the server's")
	case set["daemon"] && (cfg.role != roleClient || cfg.daemon == ""):
		return bad("-daemon SOCKET is the client's: its connect and vq tests go through the krcored at SOCKET")
	case cfg.daemon != "" && !slices.Contains(cfg.tests, testConnect) && !slices.Contains(cfg.tests, testVQ):
		return bad("-daemon routes the connect and vq tests through krcored: name one of them")
	}
	if _, _, err := net.SplitHostPort(cfg.fabricAddr); err != nil {
		return bad("-fabric-addr %q: %v", cfg.fabricAddr, err)
	}
	if cfg.link != linkShm && cfg.link != linkTCP {
		return bad("-link %q: want shm or tcp", cfg.link)
	}
	// A window whose signaled requests are further apart than the window
	// itself would stall: nothing in flight would ever complete visibly.
	cfg.cqMod = min(cfg.cqMod, cfg.txDepth)
	return nil
}

// sizes lists the message sizes a test runs in a mode.
func (cfg *config) sizes(test, mode string) []int {
	switch {
	case test == testAtomic:
		return []int{8}
	case cfg.all:
		var s []int
		for n := 2; n <= maxSize; n *= 2 {
			s = append(s, n)
		}
		return s
	case cfg.size > 0:
		return []int{cfg.size}
	case mode == modeLat:
		return []int{8}
	}
	return []int{64 << 10}
}

// iters returns the measured iterations and unmeasured warm-up for one
// size. Warm-up absorbs first-touch costs (the fabric link dial, page
// faults, goroutine start-up) that perftest's C does not have.
func (cfg *config) iters(mode string, size int) (iters, warmup int) {
	switch {
	case cfg.n > 0:
		iters = cfg.n
	case mode == modeLat:
		iters = min(1000, max(16, latBudget/size))
	default:
		iters = min(5000, max(16, bwBudget/size))
	}
	if mode == modeLat {
		return iters, min(max(iters/10, 1), 100)
	}
	return iters, min(iters, cfg.txDepth)
}

// inline is the largest payload posted inline: perftest's default of 220 B
// unless -inline says otherwise.
func (cfg *config) inlineMax() int {
	if cfg.inline >= 0 {
		return cfg.inline
	}
	return 220
}
