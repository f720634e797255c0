//go:build linux

package daemon_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
)

// TestClientNotReading: a client that sends requests and never reads the
// replies fills its socket; the daemon's send waits Config.SendTimeout for
// room, then drops the client and reclaims it, and Close (whose goodbye
// used to wait behind the stuck reply for good) returns.
func TestClientNotReading(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(1), daemon.Config{Socket: sock, SendTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	rc := dialRaw(t, sock)
	rc.hello()
	// Status replies are the largest: a few hundred fill the socket's
	// buffer, then the daemon stops reading and this side's sends wait.
	sent := 0
	for ; sent < 100000; sent++ {
		rc.conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		if err := wire.Send(rc.conn, wire.NewMsg(wire.OpStatus, uint64(sent+2))); err != nil {
			break
		}
	}
	for srv.Status().Reclaim == 0 {
		if ctx.Err() != nil {
			t.Fatalf("a client that sent %d requests and read no reply still attached after 30s", sent)
		}
		time.Sleep(10 * time.Millisecond) // polling the daemon's count
	}
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close still running")
	}
	<-served
}
