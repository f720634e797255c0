package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/verbs"
)

// TestCallsBesideASilentPeer: a Region waiting for a node that does not
// answer holds up none of the client's other calls: the daemon answers a
// RegMR and a Queue meanwhile, as a new client needs when it asks for
// all three at once (racekv.DialVQ).
func TestCallsBesideASilentPeer(t *testing.T) {
	e := startCluster(t, cluster.Config{Nodes: 3})
	c := attach(t, e)
	ctx := ctxT(t)
	e.c.Devices[2].Close() // node 3's RNIC stops answering: a control call to it waits out its retries
	slow, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Region(slow, 3, "table")
		done <- err
	}()
	waitFor(t, "the daemon to take the Region call", func() bool {
		st := e.srv.Status()
		return len(st.Clients) == 1 && st.Clients[0].Calls >= 2 // HELLO, then Region
	})
	start := time.Now()
	m, err := c.RegMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	select {
	case err := <-done:
		t.Fatalf("the Region of a silent node ended (%v) before the other calls were answered", err)
	default:
	}
	t.Logf("RegMR and Queue answered in %v beside the pending Region", took)
	q.Close()
	c.Deregister(m)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a Region of a silent node succeeded")
	}
}
