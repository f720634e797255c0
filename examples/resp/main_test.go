package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/smc"
)

// A test re-executes its binary as a peer process: childEnv names the role
// ("server": run's server through krcored at socketEnv; "client": a
// client through krcored that SETs to the server at addrEnv until killed).
const (
	childEnv  = "KRCORE_RESP_CHILD"
	socketEnv = "KRCORE_RESP_SOCKET"
	addrEnv   = "KRCORE_RESP_ADDR"
)

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "server":
		if err := run(context.Background(), []string{"-listen", "127.0.0.1:0", "-socket", os.Getenv(socketEnv)}, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "child server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "client":
		if err := childClient(os.Getenv(socketEnv), os.Getenv(addrEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "child client:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// value is the i-th value a writer with seed stores: its size and bytes
// follow from both, so a reader can check any of them.
func value(seed string, i int) []byte {
	n := 1 + (i*7919)%9000
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(len(seed) + i*31 + j)
	}
	return b
}

func testNode(t *testing.T, api krcore.API) *smc.Node {
	t.Helper()
	n, err := smc.Open(api, smc.NodeOptions{ReportEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// startServer serves a new store on an smc listener with node (nil: TCP
// only) until the test ends.
func startServer(t *testing.T, node *smc.Node) (*store, net.Listener) {
	t.Helper()
	ln, err := smc.Listen("tcp", "127.0.0.1:0", &smc.Options{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	s := newStore()
	al := &acceptLog{Listener: ln}
	go s.serve(al)
	t.Cleanup(func() { ln.Close() })
	t.Cleanup(func() { al.report(t) })
	return s, ln
}

// acceptLog keeps the connections a listener accepted, so that a failed
// test prints how the server's side of each ran (a client told "peer
// declined" learns only the reason, the error stays here).
type acceptLog struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *acceptLog) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// report logs each accepted connection's mode if t failed.
func (l *acceptLog) report(t *testing.T) {
	if !t.Failed() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		t.Logf("the server's connection from %v: %v", c.RemoteAddr(), smc.ModeOf(c))
	}
}

func dial(t *testing.T, ctx context.Context, addr string, node *smc.Node) (*respClient, net.Conn) {
	t.Helper()
	c, err := smc.DialContext(ctx, "tcp", addr, &smc.Options{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return newClient(c), c
}

// expectReply fails the test unless rp is want (printed as String prints).
func expectReply(t *testing.T, what string, rp reply, err error, want string) {
	t.Helper()
	if err != nil || rp.String() != want {
		t.Fatalf("%s: %v, %v; want %s", what, rp, err, want)
	}
}

// workload runs one Go client's commands on cl, each reply checked: SETs
// of values of 1 B to 9 KB pipelined ten at a time, GETs of them, INCRs of
// its counter, LPUSH and RPOP of its list. It returns how many of each
// command it sent.
func workload(cl *respClient, seed string, rounds int) (map[string]uint64, error) {
	sent := map[string]uint64{}
	for r := range rounds {
		for i := r * 10; i < r*10+10; i++ {
			cl.send([]byte("SET"), []byte(seed+":"+strconv.Itoa(i)), value(seed, i))
		}
		if err := cl.flush(); err != nil {
			return sent, err
		}
		for i := r * 10; i < r*10+10; i++ {
			rp, err := cl.recv()
			if err != nil { // a write may succeed on a dead connection, as on TCP: the read fails
				return sent, fmt.Errorf("SET %d: %w", i, err)
			}
			if rp.String() != `"OK"` {
				return sent, fmt.Errorf("SET %d: %v", i, rp)
			}
		}
		sent["SET"] += 10
		for i := r * 10; i < r*10+10; i++ {
			rp, err := cl.do("GET", seed+":"+strconv.Itoa(i))
			if err != nil || !bytes.Equal(rp.str, value(seed, i)) {
				return sent, fmt.Errorf("GET %d: %d bytes, %v", i, len(rp.str), err)
			}
			sent["GET"]++
		}
		if rp, err := cl.do("INCR", seed+":ctr"); err != nil || rp.n != int64(r+1) {
			return sent, fmt.Errorf("INCR round %d: %v, %v", r, rp, err)
		}
		if rp, err := cl.do("LPUSH", seed+":list", strconv.Itoa(r)); err != nil || rp.n != 1 {
			return sent, fmt.Errorf("LPUSH round %d: %v, %v", r, rp, err)
		}
		if rp, err := cl.do("RPOP", seed+":list"); err != nil || string(rp.str) != strconv.Itoa(r) {
			return sent, fmt.Errorf("RPOP round %d: %v, %v", r, rp, err)
		}
		sent["INCR"]++
		sent["LPUSH"]++
		sent["RPOP"]++
	}
	return sent, nil
}

// redisBenchmark is the redis-benchmark binary, or "" with the test
// skipped (outside CI) when it is not installed; in CI (.ci/run installs
// redis-tools) its absence fails the test.
func redisBenchmark(t *testing.T) string {
	p, err := exec.LookPath("redis-benchmark")
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("redis-benchmark not found (Debian's redis-tools; .ci/run installs it)")
	}
	t.Skip("redis-benchmark not found: install Debian's redis-tools to run this test")
	return ""
}

// TestRedisBenchmark: redis-benchmark (over TCP: it knows nothing of SMC)
// and Go RESP clients (over SMC, embedded and through krcored) use one
// server on one smc listener at once. Every Go reply is checked; the
// server ran exactly the commands both sent (no lost or repeated
// command on either path); the server's Node counted both kinds of
// connection.
func TestRedisBenchmark(t *testing.T) {
	bench := redisBenchmark(t)
	ctx := ctxT(t, 3*time.Minute)
	others, node1 := testcluster.APIs(t, 2)
	srvNode := testNode(t, others[0])
	s, ln := startServer(t, srvNode)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	const n = 4000
	tests := []string{"ping", "set", "get", "incr", "lpush", "lpop", "mset"}

	var wg sync.WaitGroup
	var out []byte
	var benchErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		out, benchErr = exec.CommandContext(ctx, bench, "-h", "127.0.0.1", "-p", port, "-n", strconv.Itoa(n), "-c", "8",
			"-r", "1000", "-t", strings.Join(tests, ","), "--csv").CombinedOutput()
	}()
	var mu sync.Mutex
	goSent := map[string]uint64{}
	for name, api := range node1 {
		cliNode := testNode(t, api)
		for g := range 2 {
			cl, c := dial(t, ctx, ln.Addr().String(), cliNode)
			if m := smc.ModeOf(c); !m.SMC {
				t.Fatalf("Go client %s/%d: %v, want SMC", name, g, m)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent, err := workload(cl, fmt.Sprintf("%s/%d", name, g), 40)
				if err != nil {
					t.Errorf("Go client %s/%d over SMC: %v", name, g, err)
				}
				mu.Lock()
				for k, v := range sent {
					goSent[k] += v
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	t.Logf("redis-benchmark -n %d -c 8 -r 1000 -t %s, over TCP beside the Go clients over SMC:\n%s", n, strings.Join(tests, ","), out)
	if benchErr != nil {
		t.Fatalf("redis-benchmark: %v", benchErr)
	}
	for _, tn := range tests {
		if !bytes.Contains(out, []byte(`"`+strings.ToUpper(tn))) {
			t.Errorf("redis-benchmark printed no %s result", tn)
		}
	}
	want := map[string]uint64{"PING": 2 * n, "SET": n + goSent["SET"], "GET": n + goSent["GET"], "INCR": n + goSent["INCR"],
		"LPUSH": n + goSent["LPUSH"], "LPOP": n, "RPOP": goSent["RPOP"], "MSET": n}
	for cmd, w := range want {
		if got := s.count(cmd); got != w {
			t.Errorf("the server ran %s %d times, want %d", cmd, got, w)
		}
	}
	st := srvNode.Stats()
	if st.SMC != 4 || st.Fallbacks[smc.ReasonPeerNoSMC] < 8 || st.BytesReceived == 0 {
		t.Errorf("server Node: %d SMC connections (want 4), %d fallbacks (want redis-benchmark's, >= 8), %d bytes over SMC",
			st.SMC, st.Fallbacks[smc.ReasonPeerNoSMC], st.BytesReceived)
	}
}

// startChild runs this test binary as a peer process in role and returns
// its stdout, line by line; the test kills it at the end.
func startChild(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(stdout)
}

// lineWith reads sc until a line starting with prefix and returns it, or
// fails the test.
func lineWith(t *testing.T, sc *bufio.Scanner, prefix string) string {
	t.Helper()
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return sc.Text()
		}
		t.Logf("child: %s", sc.Text())
	}
	t.Fatalf("the child ended before printing %q: %v", prefix, sc.Err())
	return ""
}

// deadOrReset says whether err is how a connection whose peer process died
// ends: a reset (smc: the peer's TCP connection ended without its close
// flag) or an EOF at a reply boundary is not enough, as the peer never
// closed; only ECONNRESET is.
func deadOrReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// TestServerKilled: the RESP server process (through krcored) is killed
// while a Go client over SMC streams pipelined SETs at it. Every reply
// that arrived was whole and in order; then reads and writes fail with
// ECONNRESET, well before the connection's deadline.
func TestServerKilled(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	c, sock := testcluster.StartDaemon(t, 2)
	child, sc := startChild(t, "server", socketEnv+"="+sock)
	var addr string
	if _, err := fmt.Sscanf(lineWith(t, sc, "listening "), "listening %s smc=true", &addr); err != nil {
		t.Fatal(err)
	}
	cliNode := testNode(t, core.Embed(c.Node(2)))
	cl, conn := dial(t, ctx, addr, cliNode)
	if m := smc.ModeOf(conn); !m.SMC {
		t.Fatalf("client mode %v, want SMC", m)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second)) // a hang shows as a deadline error

	werr := make(chan error, 1)
	go func() { // SETs until the connection fails
		for i := 0; ; i++ {
			cl.send([]byte("SET"), []byte("k"+strconv.Itoa(i)), value("k", i))
			if i%10 == 9 {
				if err := cl.flush(); err != nil {
					werr <- err
					return
				}
			}
		}
	}()
	replies := 0
	var rerr error
	var killed time.Time
	for {
		rp, err := cl.recv()
		if err != nil {
			rerr = err
			break
		}
		if rp.String() != `"OK"` {
			t.Fatalf("reply %d: %v", replies, rp)
		}
		replies++
		if replies == 500 {
			child.Process.Kill()
			killed = time.Now()
		}
	}
	failed := time.Since(killed)
	if replies < 500 || !deadOrReset(rerr) {
		t.Fatalf("after %d whole replies, read: %v; want ECONNRESET", replies, rerr)
	}
	select {
	case err := <-werr:
		if !deadOrReset(err) {
			t.Errorf("write: %v, want ECONNRESET", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer still blocked 10 s after the server died")
	}
	t.Logf("%d whole replies, then, %v after the kill: %v", replies, failed, rerr)
}

// childClient is a client process through krcored: it SETs c:0, c:1, ...
// over SMC to addr, pipelined, and prints "acked N" once N replies came,
// until it is killed.
func childClient(sock, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		return err
	}
	node, err := smc.Open(api, smc.NodeOptions{ReportEvery: -1})
	if err != nil {
		return err
	}
	c, err := smc.DialContext(ctx, "tcp", addr, &smc.Options{Node: node})
	if err != nil {
		return err
	}
	if m := smc.ModeOf(c); !m.SMC {
		return fmt.Errorf("mode %v, want SMC", m)
	}
	cl := newClient(c)
	go func() {
		for i := 0; ; i++ {
			cl.send([]byte("SET"), []byte("c:"+strconv.Itoa(i)), value("c", i))
			if cl.flush() != nil {
				return
			}
		}
	}()
	for i := 1; ; i++ {
		if rp, err := cl.recv(); err != nil || rp.String() != `"OK"` {
			return fmt.Errorf("reply %d: %v, %v", i, rp, err)
		}
		if i%200 == 0 {
			fmt.Printf("acked %d\n", i)
		}
	}
}

// TestClientKilled: a client process (through krcored) is killed while it
// streams SETs over SMC to the server. The server's connection ends with
// an error and is closed; what the server stored is exactly the SETs
// c:0 ... c:m-1 with their whole values, a prefix of what was sent (no
// lost, torn or reordered command); the server goes on serving.
func TestClientKilled(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	c, sock := testcluster.StartDaemon(t, 2)
	srvNode := testNode(t, core.Embed(c.Node(2)))
	s, ln := startServer(t, srvNode)
	child, sc := startChild(t, "client", socketEnv+"="+sock, addrEnv+"="+ln.Addr().String())
	lineWith(t, sc, "acked 1000")
	child.Process.Kill()
	killed := time.Now()
	for len(srvNode.Conns()) > 0 {
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("the dead client's connection is still open: %+v", srvNode.Conns())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the server closed the dead client's connection %v after the kill", time.Since(killed))

	s.mu.Lock()
	m := 0
	for ; ; m++ {
		v, ok := s.str["c:"+strconv.Itoa(m)]
		if !ok {
			break
		}
		if !bytes.Equal(v, value("c", m)) {
			t.Errorf("c:%d holds %d bytes, not the %d the client sent", m, len(v), len(value("c", m)))
		}
	}
	stored := len(s.str)
	s.mu.Unlock()
	if m < 1000 || stored != m {
		t.Errorf("the server holds %d keys, c:0..c:%d in sequence; want at least the 1000 acknowledged, and no gap", stored, m-1)
	}
	if st := srvNode.Stats(); st.SMC != 1 {
		t.Errorf("the client ran %d SMC connections, want 1", st.SMC)
	}

	cl, _ := dial(t, ctx, ln.Addr().String(), testNode(t, core.Embed(c.Node(1))))
	rp, err := cl.do("GET", "c:0")
	if err != nil || !bytes.Equal(rp.str, value("c", 0)) {
		t.Fatalf("a new client after the death: %v, %v", rp, err)
	}
}

// TestNoRDMA: a client whose runtime loses its RDMA (the krcored it runs
// through stops) mid-stream: its SMC connection fails with ECONNRESET
// within its deadline, after every reply that came was whole; a new
// connection from the same process falls back to TCP with the reason
// recorded and works, every reply checked, as does one from a process with
// no runtime at all (a server without one: all its clients run TCP). The
// server holds every SET it acknowledged.
func TestNoRDMA(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	c, srv, sock := testcluster.StartDaemonServer(t, 2)
	api, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() }) // after the connections and Node: Close unmaps its memory
	cliNode := testNode(t, api)
	_, ln := startServer(t, testNode(t, core.Embed(c.Node(2))))
	cl, conn := dial(t, ctx, ln.Addr().String(), cliNode)
	if m := smc.ModeOf(conn); !m.SMC {
		t.Fatalf("mode %v, want SMC", m)
	}
	if _, err := workload(cl, "before", 5); err != nil {
		t.Fatal(err)
	}

	srv.Close() // the runtime the client's Node runs on is gone
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	var werr error
	for i := 0; werr == nil; i++ {
		_, werr = workload(cl, "after"+strconv.Itoa(i), 1)
	}
	if !deadOrReset(werr) || time.Since(start) > 15*time.Second {
		t.Fatalf("the SMC connection after its runtime stopped: %v after %v; want ECONNRESET", werr, time.Since(start))
	}
	t.Logf("SMC connection after krcored stopped: %v after %v", werr, time.Since(start))

	cl2, conn2 := dial(t, ctx, ln.Addr().String(), cliNode)
	m := smc.ModeOf(conn2)
	if m.SMC || m.Reason == smc.ReasonNone {
		t.Fatalf("a new connection from the Node without a runtime: %v, want TCP with a reason", m)
	}
	t.Logf("a new connection: %v", m)
	if _, err := workload(cl2, "tcp", 5); err != nil {
		t.Fatalf("over TCP: %v", err)
	}
	cl3, conn3 := dial(t, ctx, ln.Addr().String(), nil)
	if m := smc.ModeOf(conn3); m.Reason != smc.ReasonNoRuntime {
		t.Fatalf("a client without a Node: %v", m)
	}
	if _, err := workload(cl3, "plain", 5); err != nil {
		t.Fatalf("over TCP: %v", err)
	}
	for i := range 50 {
		rp, err := cl3.do("GET", "before:"+strconv.Itoa(i))
		if err != nil || !bytes.Equal(rp.str, value("before", i)) {
			t.Fatalf("before:%d after the runtime stopped: %v %v", i, rp, err)
		}
	}

	// A server process with no runtime (no krcored at its socket): it says
	// so, and its clients, SMC ones included, run TCP.
	_, sc := startChild(t, "server", socketEnv+"="+sock+".none")
	lineWith(t, sc, "no krcore runtime")
	var addr string
	if _, err := fmt.Sscanf(lineWith(t, sc, "listening "), "listening %s smc=false", &addr); err != nil {
		t.Fatal(err)
	}
	cl4, conn4 := dial(t, ctx, addr, testNode(t, core.Embed(c.Node(2))))
	if m := smc.ModeOf(conn4); m.Reason != smc.ReasonPeerDeclined || m.Peer != smc.ReasonNoRuntime {
		t.Fatalf("an SMC client of a server without a runtime: %v", m)
	}
	if _, err := workload(cl4, "x", 5); err != nil {
		t.Fatal(err)
	}
}
