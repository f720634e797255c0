package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// asMainEnv makes the test binary behave as krbench itself, so the
// cross-process test (and the demo's server child) can re-exec it instead
// of building a binary.
const asMainEnv = "KRBENCH_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for a server goroutine to write while
// the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runKrbench runs krbench in this process and returns exit status, stdout
// and stderr.
func runKrbench(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"-bogus"},
		{"-server", "-client", "x"},
		{"-inproc", "-test", "nosuch"},
		{"-inproc", "-mode", "fast"},
		{"-inproc", "-s", "0"},
		{"-inproc", "-s", "8", "-a"},
		{"-inproc", "-n", "-3"},
		{"-inproc", "-tx-depth", "0"},
		{"-inproc", "-atomic-op", "xor"},
		{"-inproc", "-spin", "-1s"},
		{"-inproc", "-timeout", "0s"},
		{"-server", "read-lat"},
		{"client"},
		{"-client", "host:1:2"},
		{"-inproc", "-fabric-addr", "nonsense"},
		{"-inproc", "mesh", "-nodes", "1"},
		{"-inproc", "cluster", "-nodes", "1000"},
		{"-inproc", "vq-fast"},
		{"-inproc", "-daemon", "/tmp/krcored.sock", "vq"},
		{"-client", "h", "-daemon", "/tmp/krcored.sock", "read"},
		{"-client", "h", "-keep-runtime", "vq"},
	} {
		code, stdout, stderr := runKrbench(t, context.Background(), args...)
		if code != 2 {
			t.Errorf("krbench %q: exit %d, want 2 (usage); stderr: %s", args, code, stderr)
		}
		if stdout != "" || !strings.Contains(stderr, "krbench:") {
			t.Errorf("krbench %q: want only a message on stderr; stdout %q stderr %q", args, stdout, stderr)
		}
	}
	if code, _, _ := runKrbench(t, context.Background(), "-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

func TestParseArgs(t *testing.T) {
	var discard bytes.Buffer
	cfg, err := parseArgs([]string{"-client", "10.0.0.1", "read-lat", "write_bw"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.role != roleClient || cfg.server != "10.0.0.1:18515" {
		t.Errorf("role %v server %q", cfg.role, cfg.server)
	}
	if strings.Join(cfg.tests, ",") != "read,write" || strings.Join(cfg.modesOf(testRead), ",") != "lat" ||
		strings.Join(cfg.modesOf(testWrite), ",") != "bw" || cfg.baseline {
		t.Errorf("tests %v modes %v baseline %v", cfg.tests, cfg.modes, cfg.baseline)
	}
	cfg, err = parseArgs([]string{"-inproc", "-test", "read", "-mode", "lat", "-baseline"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.tests, ",") != "raw,read" || strings.Join(cfg.modesOf(testRaw), ",") != "lat" {
		t.Errorf("-baseline with read lat: tests %v modes %v", cfg.tests, cfg.modes)
	}
	cfg, err = parseArgs([]string{"-inproc", "read-lat", "-n", "7", "write-bw", "-s", "64"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.n != 7 || cfg.size != 64 || strings.Join(cfg.tests, ",") != "read,write" {
		t.Errorf("words between flags: n %d size %d tests %v", cfg.n, cfg.size, cfg.tests)
	}
	cfg, err = parseArgs([]string{"demo", "-n", "5"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.role != roleDemo || !cfg.baseline || cfg.tests[0] != testRaw || len(cfg.tests) != len(allTests) || cfg.n != 5 {
		t.Errorf("demo: %+v", cfg)
	}
	cfg, err = parseArgs([]string{"-inproc", "-a", "-test", "atomic"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.sizes(testAtomic, modeBW); len(got) != 1 || got[0] != 8 {
		t.Errorf("atomic sizes with -a = %v, want [8]", got)
	}
	if got := cfg.sizes(testRead, modeLat); len(got) != 23 || got[0] != 2 || got[22] != 8<<20 {
		t.Errorf("-a sizes = %v", got)
	}
	if it, _ := cfg.iters(modeBW, 8<<20); it != 64 {
		t.Errorf("default bw iterations at 8 MiB = %d, want the 512 MiB budget (64)", it)
	}
	cfg, err = parseArgs([]string{"-inproc", "krcore", "-nodes", "3"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.tests, ",") != "cluster,connect,vq,mesh" || cfg.nodes != 3 || cfg.baseline {
		t.Errorf("krcore: tests %v nodes %d baseline %v", cfg.tests, cfg.nodes, cfg.baseline)
	}
	cfg, err = parseArgs([]string{"-client", "h", "vq-lat", "mesh"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.modesOf(testVQ), ",") != "lat" || cfg.baseline || len(cfg.tests) != 2 {
		t.Errorf("vq-lat mesh: tests %v modes %v baseline %v", cfg.tests, cfg.modes, cfg.baseline)
	}
	if addr, err := serverAddr("[::1]"); err != nil || addr != "[::1]:18515" {
		t.Errorf("serverAddr([::1]) = %q, %v", addr, err)
	}
}

// parseTables parses krbench's text output and fails the test on junk.
func parseTables(t *testing.T, out string) *perf.Report {
	t.Helper()
	rep, err := perf.ParseText(strings.NewReader(out))
	if err != nil {
		t.Fatalf("output does not parse: %v\n%s", err, out)
	}
	return rep
}

// checkSuite asserts the tables of a suite run with -n iters at placement.
func checkSuite(t *testing.T, rep *perf.Report, placement string, iters int, tests ...string) {
	t.Helper()
	for _, test := range tests {
		if test == testConnect {
			r := rep.FindAt(placement, testConnect, perf.ModeLat)
			if r == nil {
				t.Errorf("%s: no connect table", placement)
				continue
			}
			for _, ph := range phases {
				row := r.LabelRow(ph)
				if row == nil || row.Iterations != iters || row.Typical <= 0 {
					t.Errorf("%s connect phase %s: %+v", placement, ph, row)
				}
			}
			continue
		}
		size := 8
		if test != testAtomic {
			size = 64 << 10
		}
		lat, bw := rep.FindAt(placement, test, perf.ModeLat), rep.FindAt(placement, test, perf.ModeBW)
		if lat == nil || bw == nil {
			t.Errorf("%s %s: lat table %v, bw table %v", placement, test, lat != nil, bw != nil)
			continue
		}
		if row := lat.LatencyRow(8); row == nil || row.Iterations != iters || row.Min <= 0 || row.Min > row.Typical || row.Typical > row.Max {
			t.Errorf("%s %s lat 8 B row: %+v", placement, test, row)
		}
		if row := bw.BandwidthRow(size); row == nil || row.Iterations != iters || row.AvgMBps <= 0 || row.PeakMBps < row.AvgMBps*0.99 {
			t.Errorf("%s %s bw %d B row: %+v", placement, test, size, row)
		}
	}
}

func TestInproc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-n", "20", "-test", "read,write,send,atomic,connect")
	if code != 0 {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, out)
	}
	rep := parseTables(t, out)
	checkSuite(t, rep, placementInproc, 20, testRead, testWrite, testSend, testAtomic, testConnect)
	checkTargets(t, rep, "in-process krcore warm connect t_typical")
	found := false
	for _, c := range rep.Checks {
		if c.Name == "in-process read 8B t_typical" && c.Unit == "usec" && c.Met != nil {
			found = true
		}
	}
	if !found {
		t.Errorf("no in-process READ target in checks: %+v", rep.Checks)
	}
}

func TestInprocJSONAllSizes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-json", "-n", "2", "-a", "read-lat", "send-bw")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if r := rep.Find(testRead, perf.ModeLat); r == nil || len(r.Latency) != 23 || r.Latency[22].Bytes != 8<<20 {
		t.Fatalf("read lat over -a sizes: %+v", r)
	}
	if r := rep.Find(testSend, perf.ModeBW); r == nil || len(r.Bandwidth) != 23 {
		t.Fatalf("send bw over -a sizes: %+v", r)
	}
	if rep.Find(testRead, perf.ModeBW) != nil || rep.Find(testSend, perf.ModeLat) != nil {
		t.Error("ran a mode nobody asked for")
	}
}

// TestCrossProcess runs the demo: this test binary re-executed as krbench
// starts a server child (itself again) and runs the suite against it over
// the soft fabric's TCP wire, then in process.
func TestCrossProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	start := time.Now()
	stdout := krbenchProcess(t, "demo", "-n", "20", "-timeout", "5s")
	t.Logf("demo with -n 20 took %v", time.Since(start))
	rep := parseTables(t, stdout)
	checkSuite(t, rep, placementCross, 20, testRead, testWrite, testSend, testAtomic, testConnect)
	checkSuite(t, rep, placementInproc, 20, testRead, testWrite, testSend, testAtomic, testConnect)
	checkKrcore(t, rep, placementCross, 20)
	checkKrcore(t, rep, placementInproc, 20)
	checkLocal(t, rep, 20)
	if n := strings.Count(stdout, testClusterTitle); n != 1 {
		t.Errorf("walkthrough printed %d times, want once", n)
	}
	if i, j := strings.Index(stdout, testClusterTitle), strings.Index(stdout, "TCP ping-pong Latency Test"); i < 0 || j < 0 || i > j {
		t.Errorf("the walkthrough does not come first")
	}
	checkTargets(t, rep,
		"cross-process krcore warm connect t_typical",
		"cross-process krcore warm connects/s, 1 goroutine(s), median block",
		"cross-process krcore cold connect / 8B READ to the MetaServer node t_typical (interleaved)",
		"cross-process raw RC connect total / krcore warm connect t_typical",
		"cross-process VQ 8B READ t_typical / raw QP t_typical (interleaved)",
		"in-process VQ 8B READ t_typical / raw QP t_typical (interleaved)")
	if r := rep.FindAt(placementCross, testRaw, perf.ModeLat); r == nil || r.LatencyRow(8) == nil {
		t.Error("no TCP ping-pong baseline")
	}
	if r := rep.FindAt(placementCross, testRaw, perf.ModeBW); r == nil || r.BandwidthRow(64<<10) == nil {
		t.Error("no TCP stream baseline")
	}
	if r := rep.FindAt(placementCross, testPairRead, perf.ModeLat); r == nil || r.LabelRow(seriesTCP) == nil || r.LabelRow(testRead) == nil {
		t.Errorf("no interleaved READ/TCP table: %+v", r)
	}
	if r := rep.FindAt(placementCross, testPairWrite, perf.ModeBW); r == nil || r.BandwidthLabelRow(seriesTCP) == nil || r.BandwidthLabelRow(testWrite) == nil {
		t.Errorf("no interleaved WRITE/TCP table: %+v", r)
	}
	targets := map[string]bool{}
	for _, c := range rep.Checks {
		if c.Target != "" {
			targets[c.Name] = true
		}
		if c.Value <= 0 {
			t.Errorf("check %q = %v", c.Name, c.Value)
		}
	}
	for _, want := range []string{
		"read 8B t_typical / tcp 8B RTT t_typical (interleaved)",
		"write 64KiB BW average / tcp 64KiB stream BW average (interleaved)",
		"in-process read 8B t_typical",
	} {
		if !targets[want] {
			t.Errorf("no target check %q; checks: %+v", want, rep.Checks)
		}
	}
}

// fakeServer accepts control connections and hands each to serve.
func fakeServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln.Addr().String()
}

func TestDeadOrSilentServer(t *testing.T) {
	ctx := context.Background()
	// Nobody listening.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if code, _, stderr := runKrbench(t, ctx, "-client", addr, "-timeout", "2s"); code != 1 || !strings.Contains(stderr, "connect to server") {
		t.Errorf("no server: exit %d, stderr %q", code, stderr)
	}
	// A server that hangs up at once.
	addr = fakeServer(t, func(c net.Conn) { c.Close() })
	if code, _, stderr := runKrbench(t, ctx, "-client", addr, "-timeout", "2s"); code != 1 || !strings.Contains(stderr, "closed by peer") {
		t.Errorf("hang-up: exit %d, stderr %q", code, stderr)
	}
	// A server that never answers: bounded by -timeout.
	addr = fakeServer(t, func(c net.Conn) { time.Sleep(5 * time.Second); c.Close() })
	start := time.Now()
	if code, _, stderr := runKrbench(t, ctx, "-client", addr, "-timeout", "300ms"); code != 1 || !strings.Contains(stderr, "silent") {
		t.Errorf("silent server: exit %d, stderr %q", code, stderr)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("silent server took %v to give up with -timeout 300ms", d)
	}
}

// startServer runs krbench -server in this process and returns its address
// and a function that stops it (SIGINT's path) and returns the exit status.
func startServer(t *testing.T, args ...string) (string, func() int) {
	t.Helper()
	addr, _, stop := startServerOut(t, args...)
	return addr, stop
}

// startServerOut is startServer that also returns the server's stdout
// up to its listening line.
func startServerOut(t *testing.T, args ...string) (addr, out string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var outb, errb syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"-server", "-port", "0"}, args...), &outb, &errb) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(outb.String(), listenPrefix) {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("server did not start: %s", errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	out = outb.String()
	_, addr, _ = strings.Cut(out, listenPrefix)
	return strings.TrimSpace(addr), out, func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(10 * time.Second):
			t.Fatal("server did not stop")
			return -1
		}
	}
}

func TestServerBusyAndStop(t *testing.T) {
	addr, stop := startServer(t)
	// A first client holds the server...
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first := newCtrl(context.Background(), conn)
	if _, err := first.call(&msg{Op: opHello, Version: protocolVersion, Fabric: placementCross}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// ...so a second is turned away with a clear message.
	code, _, stderr := runKrbench(t, context.Background(), "-client", addr, "-test", "read", "-n", "2", "-timeout", "5s")
	if code != 1 || !strings.Contains(stderr, "busy") {
		t.Errorf("second client: exit %d, stderr %q", code, stderr)
	}
	// A request that makes no sense is an error reply, not a crash.
	if _, err := first.call(&msg{Op: opSetup, MaxSize: 1 << 40, TxDepth: 1}, 5*time.Second); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("bad setup: %v", err)
	}
	first.Close()
	// The server takes the next client once it has seen the first leave.
	for i := 0; ; i++ {
		code, out, stderr := runKrbench(t, context.Background(), "-client", addr, "-test", "read,connect", "-mode", "lat", "-n", "3", "-timeout", "5s")
		if code == 0 {
			break
		}
		if !strings.Contains(stderr, "busy") || i == 100 {
			t.Fatalf("next client: exit %d, stderr %s\n%s", code, stderr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Cancelling the context is SIGINT: a clean exit.
	if code := stop(); code != 0 {
		t.Errorf("server exit status on SIGINT = %d, want 0", code)
	}
}

func TestServerOnce(t *testing.T) {
	addr, stop := startServer(t, "-once")
	code, out, stderr := runKrbench(t, context.Background(), "-client", addr, "-test", "atomic", "-n", "3", "-json")
	if code != 0 {
		t.Fatalf("client: exit %d: %s", code, stderr)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Find(testAtomic, perf.ModeBW) == nil {
		t.Fatalf("JSON report: %v %s", err, out)
	}
	if code := stop(); code != 0 {
		t.Errorf("-once server exit %d", code)
	}
}

// checkKrcore asserts the KRCore tables of a run with -n iters at placement.
func checkKrcore(t *testing.T, rep *perf.Report, placement string, iters int) {
	t.Helper()
	r := rep.FindAt(placement, testKrConnect, perf.ModeLat)
	if r == nil {
		t.Fatalf("%s: no KRCore connect table", placement)
	}
	for _, s := range []string{seriesCold, seriesWarm, seriesMetaRead, seriesRead8} {
		if row := r.LabelRow(s); row == nil || row.Iterations != iters || row.Typical <= 0 || row.Min > row.Typical {
			t.Errorf("%s KRCore connect %s: %+v", placement, s, row)
		}
	}
	if cold, warm := r.LabelRow(seriesCold), r.LabelRow(seriesWarm); cold != nil && warm != nil && warm.Typical >= cold.Typical {
		t.Errorf("%s: warm connect (%v usec) not cheaper than cold (%v usec)", placement, warm.Typical, cold.Typical)
	}
	if r := rep.FindAt(placement, testKrRate, perf.ModeBW); r == nil || r.BandwidthLabelRow("1") == nil || r.BandwidthLabelRow("1"+medianSuffix) == nil || r.BandwidthLabelRow("1"+medianSuffix).MsgRate <= 0 {
		t.Errorf("%s: connect rate table %+v", placement, r)
	}
	for _, test := range []string{testVQRead, testVQWrite, testVQSend} {
		r := rep.FindAt(placement, test, perf.ModeLat)
		if r == nil {
			t.Errorf("%s: no %s lat table", placement, test)
			continue
		}
		for _, s := range []string{seriesVQ, seriesQP} {
			if row := r.LabelRow(s); row == nil || row.Iterations != iters || row.Typical <= 0 {
				t.Errorf("%s %s lat %s: %+v", placement, test, s, row)
			}
		}
		if test == testVQSend {
			continue
		}
		b := rep.FindAt(placement, test, perf.ModeBW)
		if b == nil {
			t.Errorf("%s: no %s bw table", placement, test)
			continue
		}
		for _, s := range []string{seriesVQ, seriesQP} {
			if row := b.BandwidthLabelRow(s); row == nil || row.Iterations != iters || row.MsgRate <= 0 {
				t.Errorf("%s %s bw %s: %+v", placement, test, s, row)
			}
			if row := b.BandwidthLabelRow(s + medianSuffix); row == nil || row.Iterations != iters/pairBlocks || row.MsgRate <= 0 {
				t.Errorf("%s %s bw %s: %+v", placement, test, s+medianSuffix, row)
			}
		}
	}
}

// checkLocal asserts the walkthrough and mesh tables (always in-process).
func checkLocal(t *testing.T, rep *perf.Report, iters int) {
	t.Helper()
	r := rep.FindAt(placementInproc, testCluster, perf.ModeLat)
	if r == nil {
		t.Fatal("no walkthrough table")
	}
	for _, s := range []string{stepUp, stepCold, stepWarm, stepRC, stepRead, stepWrite, stepSendRTT} {
		row := r.LabelRow(s)
		if row == nil || row.Iterations < 1 || row.Typical <= 0 {
			t.Errorf("walkthrough step %s: %+v", s, row)
		}
	}
	m := rep.FindAt(placementInproc, testMesh, perf.ModeLat)
	if m == nil {
		t.Fatal("no mesh table")
	}
	for _, s := range []string{seriesKrcore, seriesRC} {
		if row := m.LabelRow(s); row == nil || row.Iterations != iters || row.Typical <= 0 {
			t.Errorf("mesh %s: %+v", s, row)
		}
	}
}

// checkTargets asserts that every named check is there with a target.
func checkTargets(t *testing.T, rep *perf.Report, names ...string) {
	t.Helper()
	got := map[string]perf.Check{}
	for _, c := range rep.Checks {
		got[c.Name] = c
	}
	for _, n := range names {
		c, ok := got[n]
		if !ok || c.Met == nil || c.Target == "" || c.Value <= 0 {
			t.Errorf("check %q: %+v (present %v); checks: %+v", n, c, ok, rep.Checks)
		}
	}
}

func TestInprocKrcore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-n", "20", "-nodes", "3", "krcore")
	if code != 0 {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, out)
	}
	rep := parseTables(t, out)
	checkKrcore(t, rep, placementInproc, 20)
	checkLocal(t, rep, 20)
	checkTargets(t, rep,
		"in-process krcore warm connect t_typical",
		"in-process krcore warm connects/s, 1 goroutine(s), median block",
		"in-process VQ 8B READ t_typical / raw QP t_typical (interleaved)")
	for _, c := range rep.Checks {
		if c.Name == "in-process full mesh of 3 nodes: raw RC / krcore t_typical (interleaved)" && c.Value > 0 {
			return
		}
	}
	t.Errorf("no mesh ratio in checks: %+v", rep.Checks)
}

func TestInprocVQJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-json", "-n", "10", "vq-lat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	for _, test := range []string{testVQRead, testVQWrite, testVQSend} {
		r := rep.Find(test, perf.ModeLat)
		if r == nil || r.LabelRow(seriesVQ) == nil || r.LabelRow(seriesQP) == nil || r.LabelRow(seriesVQ).Iterations != 10 {
			t.Errorf("%s lat: %+v", test, r)
		}
		if rep.Find(test, perf.ModeBW) != nil {
			t.Errorf("%s: ran bw, asked for lat only", test)
		}
	}
}

// TestDaemonBench runs krbench daemon: the server node and krcored in child
// processes (this test binary again), the embedded node and the daemon's
// client here; every series and the targets' figures come out.
func TestDaemonBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	rep := parseTables(t, krbenchProcess(t, "daemon", "-n", "20", "-procs", "2", "-spin", "20us", "-timeout", "10s"))
	for _, test := range []string{testDRead, testDReadOwn, testDWrite, testDSend, testDConnect} {
		r := rep.FindAt(placementCross, test, perf.ModeLat)
		if r == nil || r.LabelRow(seriesEmbedded) == nil || r.LabelRow(seriesDaemon) == nil {
			t.Errorf("%s: no embedded and daemon rows: %+v", test, r)
		}
	}
	checkTargets(t, rep,
		"own node: daemon 8B READ t_typical minus embedded t_typical",
		"warm connect through the daemon t_typical")
	if runtime.GOOS == "linux" && runtime.NumCPU() >= 2 {
		for _, c := range rep.Checks {
			if strings.HasPrefix(c.Name, "cross-core round trip") && c.Value > 0 {
				return
			}
		}
		t.Errorf("no cross-core round trip figure: %+v", rep.Checks)
	}
}

// TestClientDaemon runs krbench -client -daemon: a -keep-runtime server in
// this process, krcored as a child process joined to its MetaServer (this
// binary's krcored role), and the client in a process of its own, whose
// connect and vq tests go through the daemon beside the raw baselines.
func TestClientDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	addr, out, stop := startServerOut(t, "-keep-runtime", "-timeout", "10s")
	defer stop()
	line, _, _ := strings.Cut(out, "\n")
	info, ok := strings.CutPrefix(line, metaPrefix)
	if !ok {
		t.Fatalf("server printed no MetaServer before listening: %q", out)
	}
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	krcoredProcess(t, sock, "-node", "100", "-meta", info)

	rep := parseTables(t, krbenchProcess(t, "-client", addr, "-daemon", sock, "-n", "20", "-timeout", "10s", "connect", "vq"))
	for _, want := range []struct {
		test string
		mode perf.Mode
		rows []string
	}{
		{testKrConnect, perf.ModeLat, []string{seriesWarm + daemonSuffix, seriesMetaRead, seriesRead8}},
		{testVQRead, perf.ModeLat, []string{seriesVQ + daemonSuffix, seriesQP}},
		{testVQWrite, perf.ModeLat, []string{seriesVQ + daemonSuffix, seriesQP}},
		{testVQSend, perf.ModeLat, []string{seriesVQ + daemonSuffix, seriesQP}},
	} {
		r := rep.FindAt(placementCross, want.test, want.mode)
		if r == nil {
			t.Errorf("no %s %s table", want.test, want.mode)
			continue
		}
		for _, l := range want.rows {
			if row := r.LabelRow(l); row == nil || row.Iterations == 0 {
				t.Errorf("%s: row %s: %+v", want.test, l, row)
			}
		}
		if r.LabelRow(seriesCold) != nil || r.LabelRow(seriesVQ) != nil {
			t.Errorf("%s: an embedded row in a run through the daemon", want.test)
		}
	}
	if r := rep.FindAt(placementCross, testVQRead, perf.ModeBW); r == nil || r.BandwidthLabelRow(seriesVQ+daemonSuffix+medianSuffix) == nil {
		t.Errorf("vq-read bw: no %s row: %+v", seriesVQ+daemonSuffix+medianSuffix, r)
	}
	if r := rep.FindAt(placementCross, testKrRate, perf.ModeBW); r == nil || r.BandwidthLabelRow("1"+daemonSuffix) == nil {
		t.Errorf("krcore-rate: no 1%s row: %+v", daemonSuffix, r)
	}
	checkTargets(t, rep, "cross-process krcore warm connect through krcored t_typical")
}

// krcoredProcess starts this test binary in krbench's krcored role on
// socket sock with args, waits for the socket, and stops the daemon
// (SIGTERM) when t ends.
func krcoredProcess(t *testing.T, sock string, args ...string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{childKrcored, "-socket", sock}, args...)...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("krcored: %v\nstderr: %s", err, stderr.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) { // it is starting
		if _, err := os.Stat(sock); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("krcored made no socket %s in 10s: %s", sock, stderr.String())
		}
	}
}

// krbenchProcess runs this test binary as krbench with args, in a process
// of its own (it may start children, which re-execute it), and returns
// its stdout; it fails t unless krbench exits 0 within 2 minutes.
func krbenchProcess(t *testing.T, args ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("krbench %s: %v\nstderr: %s\nstdout: %s", args[0], err, stderr.String(), stdout.String())
	}
	return stdout.String()
}
