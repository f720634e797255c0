package bench

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/perf"
)

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
	first := control.NewConn(context.Background(), conn)
	if _, err := first.Call(&control.Msg{Op: control.OpHello, Version: control.Version, Fabric: placementCross}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// ...so a second is turned away with a clear message.
	code, _, stderr := runKrbench(t, context.Background(), "-client", addr, "-test", "read", "-n", "2", "-timeout", "5s")
	if code != 1 || !strings.Contains(stderr, "busy") {
		t.Errorf("second client: exit %d, stderr %q", code, stderr)
	}
	// A request that makes no sense is an error reply, not a crash.
	if _, err := first.Call(&control.Msg{Op: control.OpSetup, MaxSize: 1 << 40, TxDepth: 1}, 5*time.Second); err == nil || !strings.Contains(err.Error(), "out of range") {
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
