package smc_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/smc"
)

// TestDaemonGone: the krcored a Node runs through stops while its
// connection's reader waits, with nothing to write: the read fails with
// ECONNRESET at once, not at the peer's leisure or the deadline.
func TestDaemonGone(t *testing.T) {
	c, srv, sock := testcluster.StartDaemonServer(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	api, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() }) // after the connections and Node: Close unmaps its memory
	cliNode := open(t, api, smc.NodeOptions{})
	srvNode := open(t, core.Embed(c.Node(2)), smc.NodeOptions{})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, cc := pair(t, ln, &smc.Options{Node: cliNode})
	if m := settled(t, s); !m.SMC {
		t.Fatal(m)
	}
	rerr := make(chan error, 1)
	go func() { _, err := cc.Read(make([]byte, 1)); rerr <- err }()
	time.Sleep(20 * time.Millisecond) // the read is waiting (not a cost stand-in)
	start := time.Now()
	srv.Close()
	select {
	case err := <-rerr:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read: %v, want ECONNRESET", err)
		}
		t.Logf("read failed %v after krcored stopped: %v", time.Since(start), err)
	case <-time.After(10 * time.Second):
		t.Fatal("a read still waits 10 s after its runtime stopped")
	}
}
