//go:build rdma

package smc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/smc"
)

// The tests run only in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1), beside the
// kernel's AF_SMC: rxeA on vethA 10.1.0.1, rxeB on vethB 10.1.0.2, a UEID
// both ends share, and ksmc (KRCORE_SMC_KSMC), the project's AF_SMC echo
// client and server, which prints smc_diag's view of its sockets.

const ueid = "KRCORE-SMC-CI"

// openRDMA opens the kernel wire mode on side "A" (rxeA, 10.1.0.1) or
// "B" (rxeB, 10.1.0.2), whose idle link groups linger 300 ms.
func openRDMA(t *testing.T, side string) *smc.RDMA {
	return openRDMALinger(t, side, 300*time.Millisecond)
}

// reuseLinger keeps an idle group up through the reuse tests: with one
// group up from the first connection to the last, every later one reused
// it.
const reuseLinger = 5 * time.Second

func openRDMALinger(t *testing.T, side string, linger time.Duration) *smc.RDMA {
	t.Helper()
	if os.Getenv("KRCORE_SMC_VM") != "1" {
		t.Skip("runs in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1)")
	}
	r, err := smc.OpenRDMA(context.Background(), smc.RDMAConfig{Device: "rxe" + side, Port: 1, GIDIndex: -1,
		Interface: "veth" + side, EID: ueid, Linger: linger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// syncBuffer is a command's output, written by exec's copying goroutine
// and read by the test as it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// ksmc is a running ksmc command.
type ksmc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

// startKsmc runs ksmc with args; the test's end kills it if it still runs.
func startKsmc(t *testing.T, args ...string) *ksmc {
	t.Helper()
	return startProc(t, exec.Command(os.Getenv("KRCORE_SMC_KSMC"), args...))
}

// startProc runs cmd, its output kept; the test's end kills it if it
// still runs.
func startProc(t *testing.T, cmd *exec.Cmd) *ksmc {
	t.Helper()
	name := filepath.Base(cmd.Path) + " " + strings.Join(cmd.Args[1:], " ")
	k := &ksmc{cmd: cmd, out: &syncBuffer{}, done: make(chan error, 1)}
	k.cmd.Stdout, k.cmd.Stderr = k.out, k.out
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { k.done <- k.cmd.Wait() }()
	t.Cleanup(func() {
		k.cmd.Process.Kill() // a no-op once it exited
		err := <-k.done
		k.done <- err
		t.Logf("%s: %v\n%s", name, err, k.out.String())
	})
	return k
}

var errRunning = errors.New("ksmc still running")

// waitOut waits at most d for want in k's output.
func (k *ksmc) waitOut(t *testing.T, want string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); !strings.Contains(k.out.String(), want); {
		if time.Now().After(end) || k.wait(20*time.Millisecond) != errRunning {
			t.Fatalf("%s: no %q (ended or %v passed):\n%s", k.cmd.Args[0], want, d, k.out.String())
		}
	}
}

// wait waits at most d for ksmc's end (errRunning if it did not).
func (k *ksmc) wait(d time.Duration) error {
	select {
	case err := <-k.done:
		k.done <- err
		return err
	case <-time.After(d):
		return errRunning
	}
}

// echoServer serves ln as an echo server: each connection's bytes back
// until its EOF, then Close; each connection's mode and end go to the
// returned channel.
func echoServer(t *testing.T, ln *smc.Listener) <-chan string {
	t.Helper()
	res := make(chan string, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := io.Copy(c, c)
				res <- fmt.Sprintf("mode %v echoed %d: %v; close: %v", smc.ModeOf(c), n, err, c.Close())
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return res
}

func listenKernel(t *testing.T, addr string, opts *smc.Options) *smc.Listener {
	t.Helper()
	ln, err := smc.Listen("tcp", addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// expectIn checks that s holds every one of want.
func expectIn(t *testing.T, what, s string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("%s: no %q in:\n%s", what, w, s)
		}
	}
}

// result waits for one connection's end on an echo server.
func result(t *testing.T, res <-chan string) string {
	t.Helper()
	select {
	case r := <-res:
		t.Log(r)
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("the Go server's connection did not end")
		return ""
	}
}

// TestKernelClientEcho: a kernel AF_SMC client reaches a Go listener in
// the kernel wire mode (on a port the kernel picked): smc_diag says SMCR (no fallback), 1 MiB comes back
// byte-exact (ksmc checks), then 1,000 8-byte ping-pongs; the client
// closes first, the Go side reads EOF and closes; the link group goes
// after the linger.
func TestKernelClientEcho(t *testing.T) {
	r := openRDMA(t, "A")
	ln := listenKernel(t, "10.1.0.1:0", &smc.Options{RDMA: r}) // any port: the option follows the socket
	res := echoServer(t, ln)
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	k := startKsmc(t, "echo", "10.1.0.1", port, "1048576", "1000")
	if err := k.wait(240 * time.Second); err != nil {
		t.Fatal(err)
	}
	expectIn(t, "kernel client", k.out.String(), "mode=SMCR", "bulk bytes=1048576", "corrupt=0", "pingpong n=1000")
	expectIn(t, "Go server", result(t, res), "mode SMC echoed 1056656: <nil>; close: <nil>")
	var n int
	var ms, rtt float64
	scanOut(t, k.out.String(), "bulk bytes=%d ms=%g", &n, &ms)
	scanOut(t, k.out.String(), "pingpong n=%d rtt_us=%g", &n, &rtt)
	// For guest.sh's ratios against the kernel pair and TCP.
	t.Logf("figure go-server bulk_ms=%.1f rtt_us=%.1f", ms, rtt)
	waitGroups(t, r, 0)
}

// scanOut scans the line of out that starts as format does.
func scanOut(t *testing.T, out, format string, args ...any) {
	t.Helper()
	i := strings.Index(out, format[:strings.Index(format, "=")])
	if i < 0 {
		t.Errorf("no %q in:\n%s", format, out)
		return
	}
	if _, err := fmt.Sscanf(out[i:], format, args...); err != nil {
		t.Errorf("scanning %q: %v", format, err)
	}
}

// waitGroups waits until r has n link groups up.
func waitGroups(t *testing.T, r *smc.RDMA, n int) {
	t.Helper()
	for i := 0; r.LinkGroups() != n; i++ {
		if i == 200 { // past reuseLinger
			t.Fatalf("%d link groups up, want %d", r.LinkGroups(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKernelClientGroupReuse: three kernel clients at once, then a
// fourth, all on one link group (the Go server accepts the later ones
// without first contact, and the kernel client finds its group by our
// system ID, GID and QP, confirming each new buffer's rkey with
// CONFIRM_RKEY), each in mode SMCR and echoed byte-exact.
func TestKernelClientGroupReuse(t *testing.T) {
	r := openRDMALinger(t, "A", reuseLinger)
	res := echoServer(t, listenKernel(t, "10.1.0.1:5207", &smc.Options{RDMA: r}))
	var ks []*ksmc
	for range 3 {
		ks = append(ks, startKsmc(t, "echo", "10.1.0.1", "5207", "262144", "100"))
	}
	ks = append(ks, nil)
	for i, k := range ks {
		if k == nil { // the fourth, once the others ended: within the linger
			ks[i] = startKsmc(t, "echo", "10.1.0.1", "5207", "262144", "100")
			k = ks[i]
		}
		if err := k.wait(120 * time.Second); err != nil {
			t.Fatal(err)
		}
		expectIn(t, fmt.Sprintf("kernel client %d", i), k.out.String(), "mode=SMCR", "corrupt=0", "pingpong n=100")
		expectIn(t, "Go server", result(t, res), "mode SMC echoed 263024: <nil>")
		if n := r.LinkGroups(); n != 1 {
			t.Errorf("after client %d: %d link groups, want 1", i, n)
		}
	}
	waitGroups(t, r, 0)
}

// TestKernelClientKilled: the kernel client process is killed mid-echo;
// the Go side's connection ends (it reads EOF or a reset, no hang), and
// once it closed, its link group goes (guest.sh checks that the kernel
// keeps no socket and no link group afterwards).
func TestKernelClientKilled(t *testing.T) {
	r := openRDMA(t, "A")
	res := echoServer(t, listenKernel(t, "10.1.0.1:5206", &smc.Options{RDMA: r}))
	k := startKsmc(t, "echo", "10.1.0.1", "5206", "1048576", "1000000")
	for !strings.Contains(k.out.String(), "bulk bytes=") { // the bulk echo is over: pings run
		if k.wait(50*time.Millisecond) != errRunning {
			t.Fatalf("ksmc ended before the kill")
		}
	}
	k.cmd.Process.Kill()
	k.wait(10 * time.Second)
	expectIn(t, "Go server", result(t, res), "mode SMC")
	waitGroups(t, r, 0)
}

// TestKernelServerDial: a Go client in the kernel wire mode reaches a
// kernel AF_SMC echo server: 1 MiB and 1,000 8-byte round trips come back
// byte-exact, then the Go side closes first; three more connections at
// once reuse the link group (the kernel's accept without first contact),
// each shutting down writing and reading to EOF. The proposal offers
// max_links 2, so the kernel sends ADD_LINK (it has rxeB as a second
// device), which the Go side declines as a kernel client would: the
// connections go on over the one link.
func TestKernelServerDial(t *testing.T) {
	r := openRDMALinger(t, "B", reuseLinger)
	srv := startKsmc(t, "serve", "-p", "-n", "4", "5205")
	opts := &smc.Options{RDMA: r}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	var c net.Conn
	var err error
	for i := 0; ; i++ { // the server may still be starting
		start := time.Now()
		if c, err = smc.DialContext(ctx, "tcp", "10.1.0.1:5205", opts); err == nil || i == 50 {
			t.Logf("connect %.1f ms", float64(time.Since(start).Microseconds())/1e3)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if m := smc.ModeOf(c); !m.SMC {
		t.Fatalf("mode %v, want SMC", m)
	}
	bulk := make([]byte, 1<<20)
	for i := range bulk {
		bulk[i] = byte(i*131 + 7)
	}
	start := time.Now()
	if err := echoCheck(c, bulk); err != nil {
		t.Fatal(err)
	}
	bulkMs := float64(time.Since(start).Microseconds()) / 1e3
	t.Logf("bulk bytes=%d ms=%.1f", len(bulk), bulkMs)
	ping, back := []byte("krcoping"), make([]byte, 8)
	var inWrite time.Duration
	for i := -10; i < 1000; i++ {
		if i == 0 {
			start, inWrite = time.Now(), 0
		}
		w := time.Now()
		if _, err := c.Write(ping); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
		inWrite += time.Since(w)
		if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, ping) {
			t.Fatalf("ping %d: %v (%q)", i, err, back)
		}
	}
	rtt := float64(time.Since(start).Microseconds()) / 1000
	t.Logf("pingpong n=1000 rtt_us=%.1f (in Write %.1f us)", rtt, float64(inWrite.Microseconds())/1000)
	// For guest.sh's ratios against the kernel pair and TCP.
	t.Logf("figure go-client bulk_ms=%.1f rtt_us=%.1f", bulkMs, rtt)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- dialEcho(ctx, opts, bulk[:64<<10], i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if err := srv.wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(srv.out.String(), "mode=SMCR"); n != 4 {
		t.Errorf("%d kernel server sockets in mode SMCR, want 4", n)
	}
	expectIn(t, "kernel server", srv.out.String(), "serve done echoed=1056656", "serve done echoed=65536")
	if n := r.AddLinksDeclined(); n != 1 {
		t.Errorf("%d ADD_LINK requests declined, want the kernel server's one", n)
	}
	waitGroups(t, r, 0)
}

// dialEcho is one of the concurrent connections: it must reuse the
// group the first made, echo b, shut down writing and read EOF.
func dialEcho(ctx context.Context, opts *smc.Options, b []byte, i int) error {
	c, err := smc.DialContext(ctx, "tcp", "10.1.0.1:5205", opts)
	if err != nil {
		return fmt.Errorf("conn %d: %w", i, err)
	}
	defer c.Close()
	if m := smc.ModeOf(c); !m.SMC {
		return fmt.Errorf("conn %d: mode %v, want SMC", i, m)
	}
	if n := opts.RDMA.LinkGroups(); n != 1 {
		return fmt.Errorf("conn %d: %d link groups, want 1 (reused)", i, n)
	}
	if err := echoCheck(c, b); err != nil {
		return fmt.Errorf("conn %d: %w", i, err)
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return fmt.Errorf("conn %d: %w", i, err)
	}
	if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
		return fmt.Errorf("conn %d: after CloseWrite: %d bytes, %v; want EOF", i, len(rest), err)
	}
	return nil
}

// echoCheck writes b (from another goroutine, as a large b does not fit
// the buffers of both directions) and reads its echo back, byte-exact.
func echoCheck(c net.Conn, b []byte) error {
	werr := make(chan error, 1)
	go func() { _, err := c.Write(b); werr <- err }()
	back := make([]byte, len(b))
	_, rerr := io.ReadFull(c, back)
	if err := errors.Join(<-werr, rerr); err != nil {
		return err
	}
	if !bytes.Equal(back, b) {
		return errors.New("the echo differs from what was written")
	}
	return nil
}

// TestKernelClientOptionOff: against a Go listener without the kernel
// wire mode (no SMC option in its SYN-ACK) the kernel client falls back
// (PEERNOSMC) and its bytes still come back.
func TestKernelClientOptionOff(t *testing.T) {
	if os.Getenv("KRCORE_SMC_VM") != "1" {
		t.Skip("runs in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1)")
	}
	res := echoServer(t, listenKernel(t, "10.1.0.1:5208", nil))
	k := startKsmc(t, "echo", "10.1.0.1", "5208", "1048576", "1000")
	if err := k.wait(120 * time.Second); err != nil {
		t.Fatal(err)
	}
	expectIn(t, "kernel client", k.out.String(), "mode=TCP fallback=0x03010000", "corrupt=0", "pingpong n=1000")
	expectIn(t, "Go server", result(t, res), "TCP", "echoed 1056656: <nil>")
}

// TestKernelPlainTCPClient: a plain TCP client (no SMC option in its
// SYN) against a Go listener in the kernel wire mode runs over TCP
// (PEERNOSMC), its bytes echoed.
func TestKernelPlainTCPClient(t *testing.T) {
	r := openRDMA(t, "A")
	res := echoServer(t, listenKernel(t, "10.1.0.1:5209", &smc.Options{RDMA: r}))
	k := startKsmc(t, "echo", "-t", "10.1.0.1", "5209", "1048576", "1000")
	if err := k.wait(120 * time.Second); err != nil {
		t.Fatal(err)
	}
	expectIn(t, "TCP client", k.out.String(), "corrupt=0", "pingpong n=1000")
	expectIn(t, "Go server", result(t, res), "TCP: peer did not indicate SMC (0x03010000)", "echoed 1056656: <nil>")
	if n := r.LinkGroups(); n != 0 {
		t.Errorf("%d link groups after a TCP client, want 0", n)
	}
}

// childEnv tells TestKernelChild which child of TestKernelGoKilled to be.
const childEnv = "KRCORE_SMC_CHILD"

// TestKernelChild is no test of its own: it is the Go process
// TestKernelGoKilled kills. With KRCORE_SMC_CHILD=serve it echoes a
// kernel client's bytes on a Go listener (rxeA, port 5210); with =dial it
// ping-pongs against a kernel server (port 5211) from rxeB; either until
// it is killed.
func TestKernelChild(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "serve":
		ln := listenKernel(t, "10.1.0.1:5210", &smc.Options{RDMA: openRDMA(t, "A")})
		fmt.Println("child listening")
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("child accepted mode %v\n", smc.ModeOf(c))
		_, err = io.Copy(c, c)
		t.Fatalf("the kernel client ended before the kill: %v", err)
	case "dial":
		opts := &smc.Options{RDMA: openRDMA(t, "B")}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, err := smc.DialContext(ctx, "tcp", "10.1.0.1:5211", opts)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("child dialed mode %v\n", smc.ModeOf(c))
		b := []byte("childpin")
		for i := 0; ; i++ {
			if i == 10 {
				fmt.Println("child pinging")
			}
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, b); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Skip("TestKernelGoKilled's child process")
	}
}

// lgrs is how many SMC-R link groups the kernel holds (ksmc lgrs).
func lgrs(t *testing.T) int {
	t.Helper()
	out, err := exec.Command(os.Getenv("KRCORE_SMC_KSMC"), "lgrs").Output()
	var n int
	if err == nil {
		_, err = fmt.Sscanf(string(out), "lgrs smcr=%d", &n)
	}
	if err != nil {
		t.Fatalf("ksmc lgrs: %v (%s)", err, out)
	}
	return n
}

// kernelDiag is ksmc diag's output: one line per AF_SMC socket.
func kernelDiag(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(os.Getenv("KRCORE_SMC_KSMC"), "diag").CombinedOutput()
	if err != nil {
		t.Fatalf("ksmc diag: %v (%s)", err, out)
	}
	return string(out)
}

// TestKernelGoKilled: a Go process in the kernel wire mode is killed
// (SIGKILL) mid-connection, once as the server of a kernel client that
// is ping-ponging, once as a client ping-ponging a kernel server. It can
// send nothing more (no abort CDC, no DELETE_LINK), and its QPs vanish
// with it: rxe drops what arrives for them, sending no NAK. The kernel
// ends each connection when it finds the link dead: at once if its next
// WRITE or SEND goes unanswered (its RC retries run out), else when its
// link test (TEST_LINK after net.smc.smcr_testlink_time, 30 s by default,
// of a quiet link) gets no answer within 2 s. Both kernel processes must
// end within that bound and the kernel's link groups go back to their
// count before; how long each took is logged. KRCORE_SMC_TESTLINK sets
// the sysctl for the test (guest.sh: 5 s, to show the bound follows it).
func TestKernelGoKilled(t *testing.T) {
	if os.Getenv("KRCORE_SMC_VM") != "1" {
		t.Skip("runs in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1)")
	}
	const sysctl = "/proc/sys/net/smc/smcr_testlink_time"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatal(err)
	}
	testlink := strings.TrimSpace(string(old))
	if v := os.Getenv("KRCORE_SMC_TESTLINK"); v != "" {
		// Link groups made from now on test their links after v seconds.
		if err := os.WriteFile(sysctl, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(sysctl, old, 0o644) })
		testlink = v
	}
	var secs int
	if _, err := fmt.Sscan(testlink, &secs); err != nil || secs <= 0 {
		t.Fatalf("net.smc.smcr_testlink_time=%q: the kernel does not test its links", testlink)
	}
	bound := time.Duration(secs+2)*time.Second + 20*time.Second // the VM is slow
	t.Logf("net.smc.smcr_testlink_time=%d: the kernel must end its side within %v", secs, bound)
	before := lgrs(t)
	child := func(role string) *ksmc {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKernelChild$", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+role)
		return startProc(t, cmd)
	}
	srv := startKsmc(t, "serve", "-n", "1", "5211")
	srv.waitOut(t, "serve listening", 30*time.Second)
	dialer := child("dial")
	server := child("serve")
	server.waitOut(t, "child listening", 60*time.Second)
	cli := startKsmc(t, "echo", "10.1.0.1", "5210", "65536", "1000000000")
	cli.waitOut(t, "bulk bytes=", 60*time.Second)
	dialer.waitOut(t, "child pinging", 60*time.Second)
	t.Logf("before the kill: %d link groups (%d before the test); smc_diag:\n%s", lgrs(t), before, kernelDiag(t))

	killed := time.Now()
	server.cmd.Process.Kill()
	dialer.cmd.Process.Kill()
	var wg sync.WaitGroup
	for _, k := range []*ksmc{cli, srv} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := k.wait(bound)
			t.Logf("kernel %s ended %.1f s after the kill: %v; smc_diag now:\n%s", k.cmd.Args[1],
				time.Since(killed).Seconds(), err, kernelDiag(t))
			if err == errRunning {
				t.Errorf("kernel %s still runs %v after the kill", k.cmd.Args[1], bound)
			}
		}()
	}
	wg.Wait()
	for lgrs(t) > before {
		if time.Since(killed) > bound+10*time.Second {
			t.Fatalf("%d link groups %v after the kill, want %d", lgrs(t), bound+10*time.Second, before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("link groups back to %d %.1f s after the kill", before, time.Since(killed).Seconds())
	if d := kernelDiag(t); d != "" {
		t.Errorf("AF_SMC sockets left after the kill:\n%s", d)
	}
	if out, err := exec.Command("dmesg").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "smc") && strings.Contains(l, "link") {
				t.Log(l)
			}
		}
	}
}

// TestKernelDialTCPServer: a Go Dial in the kernel wire mode to a plain
// TCP server (no SMC option in its SYN-ACK) sends no proposal and talks
// TCP (ReasonPeerNoSMC), as the kernel's own client does; its bytes come
// back.
func TestKernelDialTCPServer(t *testing.T) {
	r := openRDMA(t, "B")
	srv := startKsmc(t, "serve", "-t", "-n", "1", "5212")
	srv.waitOut(t, "serve listening", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := smc.DialContext(ctx, "tcp", "10.1.0.1:5212", &smc.Options{RDMA: r})
	if err != nil {
		t.Fatal(err)
	}
	if m := smc.ModeOf(c); m.SMC || m.Reason != smc.ReasonPeerNoSMC {
		t.Errorf("mode %v, want TCP for want of the option (PEERNOSMC)", m)
	}
	if err := echoCheck(c, []byte("plain TCP server, no proposal sent")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := srv.wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	expectIn(t, "kernel TCP server", srv.out.String(), "serve done echoed=34")
	if n := r.LinkGroups(); n != 0 {
		t.Errorf("%d link groups after a TCP server, want 0", n)
	}
}
