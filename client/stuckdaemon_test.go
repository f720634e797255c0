package client_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon/wire"
)

// TestDaemonNotReading: a daemon that stops reading its socket (stuck, or
// stopped) fills it; a call then ends with its context, not when the
// daemon reads again, and so do calls waiting for their turn to send.
// The daemon here answers HELLO and reads nothing more.
func TestDaemonNotReading(t *testing.T) {
	sock, ln := fakeDaemon(t)
	accepted := make(chan *net.UnixConn, 1)
	go func() {
		conn, err := ln.AcceptUnix()
		if err != nil {
			close(accepted)
			return
		}
		if m, err := wire.Recv(conn); err == nil {
			wire.Send(conn, helloReply(m))
		}
		accepted <- conn // and read no more
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if conn := <-accepted; conn != nil {
		defer conn.Close()
	}
	// 16 goroutines make 400 calls each of 2 ms, far more requests than
	// the socket holds: before, the first send that found it full waited
	// for the daemon for good, and every other caller for that send.
	const callers, calls = 16, 400
	errc := make(chan error, callers)
	for range callers {
		go func() {
			for range calls {
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Millisecond)
				_, err := c.Status(cctx)
				ccancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range callers {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("a call to a daemon that reads nothing: %v, want DeadlineExceeded", err)
			}
		case <-ctx.Done():
			t.Fatal("calls of 2 ms to a daemon that reads nothing still running after 10 s")
		}
	}
}

// fakeDaemon listens where a client attaches, for a test that plays the
// daemon; the listener closes when the test ends.
func fakeDaemon(t *testing.T) (sock string, ln *net.UnixListener) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return sock, ln
}

// helloReply is a fake daemon's answer to the client's HELLO m: client
// id 1, node 1, 16 credits, messages of up to 64 B, no features.
func helloReply(m *wire.Msg) *wire.Msg {
	return m.Reply().U64(1).U64(1).U32(16).U32(64).U32(0)
}
