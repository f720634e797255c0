package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// TestQueueTo: a queue made connected, with the region learned in the same
// call, READs the region; without a name it is only connected; a region
// not exported fails the call and leaves no queue in the daemon. The same
// holds against a daemon without FeatureQueueTo, where the client makes
// the three calls itself.
func TestQueueTo(t *testing.T) {
	e := startEnv(t)
	for _, mode := range []string{"one call", "first protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t)
			c := attach(t, e)
			if mode == "first protocol" {
				client.WithoutFeatures(c)
			}
			calls, ringCalls := daemonCalls(e, c)
			q, g, err := c.QueueTo(ctx, 2, nil, "table")
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			if mode == "one call" {
				if n, r := daemonCalls(e, c); n != calls+1 || r != ringCalls {
					t.Fatalf("QueueTo took %d calls and %d ring calls, want 1 and 0", n-calls, r-ringCalls)
				}
			}
			if g.Node() != 2 || g.Len() != 4096 || g.Access()&verbs.AccessRemoteRead == 0 {
				t.Fatalf("region node %d, %d bytes, access %v: want node 2, 4096 bytes, readable", g.Node(), g.Len(), g.Access())
			}
			buf, err := c.RegMR(64, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Deregister(buf)
			out := run(t, ctx, q, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 17), Remote: g.At(0)})
			if err := out[0].Err(); err != nil || string(buf.Bytes()[:17]) != "hello from node 2" {
				t.Fatalf("READ: %v, %q", err, buf.Bytes()[:17])
			}

			q2, g2, err := c.QueueTo(ctx, 2, nil, "")
			if err != nil || g2 != nil {
				t.Fatalf("QueueTo without a name: region %v, %v", g2, err)
			}
			defer q2.Close()
			out = run(t, ctx, q2, krcore.Request{ID: 2, Op: verbs.OpRead, Local: buf.Range(17, 4), Remote: g.At(0)})
			if err := out[0].Err(); err != nil || string(buf.Bytes()[17:21]) != "hell" {
				t.Fatalf("READ on a queue made without a region: %v, %q", err, buf.Bytes()[17:21])
			}

			before := daemonVQs(e, c)
			_, _, err = c.QueueTo(ctx, 2, nil, "no such region")
			if !errors.Is(err, krcore.ErrNoRegion) {
				t.Fatalf("QueueTo a region not exported: %v, want ErrNoRegion", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "node 2") || !strings.Contains(msg, `"no such region"`) {
				t.Fatalf("QueueTo's error %q does not name the node and the region", msg)
			}
			if n := daemonVQs(e, c); n != before {
				t.Fatalf("the daemon holds %d of the client's queues after a failed QueueTo, want %d", n, before)
			}
		})
	}
}

// daemonVQs is how many queues the daemon holds for c.
func daemonVQs(e *env, c *client.Client) int {
	return len(clientStatus(e, c).VQs)
}

// daemonCalls is how many calls c made to the daemon on its socket and on
// its queues' rings.
func daemonCalls(e *env, c *client.Client) (calls, ringCalls uint64) {
	cs := clientStatus(e, c)
	return cs.Calls, cs.RingCalls
}

// clientStatus is the daemon's status of c.
func clientStatus(e *env, c *client.Client) wire.ClientStatus {
	for _, cs := range e.srv.Status().Clients {
		if cs.ID == c.ID() {
			return cs
		}
	}
	return wire.ClientStatus{}
}

// TestQueueToUnreachable: a QueueTo to a node that does not exist fails
// within its context with the connect's error, which names the node and
// the region asked for, and leaves no queue; so too against a daemon
// without FeatureQueueTo.
func TestQueueToUnreachable(t *testing.T) {
	e := startEnv(t)
	for _, mode := range []string{"one call", "first protocol"} {
		t.Run(mode, func(t *testing.T) {
			c := attach(t, e)
			if mode == "first protocol" {
				client.WithoutFeatures(c)
			}
			ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
			defer cancel()
			q, g, err := c.QueueTo(ctx, 99, nil, "table")
			if err == nil || q != nil || g != nil {
				t.Fatalf("QueueTo node 99: %v, %v, %v: want an error and nothing", q, g, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "node 99") || !strings.Contains(msg, `"table"`) {
				t.Fatalf("QueueTo's error %q does not name the node and the region", msg)
			}
			if n := daemonVQs(e, c); n != 0 {
				t.Fatalf("the daemon holds %d queues of the client, want 0", n)
			}
		})
	}
}

// TestQueueToGivenUp: a QueueTo whose context ends before krcored answers
// leaves no queue in the daemon once the answer comes (the client closes
// it), and the client goes on making queues.
func TestQueueToGivenUp(t *testing.T) {
	e := startEnv(t)
	c := attach(t, e)
	for range 10 {
		ctx, cancel := context.WithCancel(ctxT(t))
		cancel() // sent, then given up at once: the answer comes later
		if q, _, err := c.QueueTo(ctx, 2, nil, "table"); !errors.Is(err, context.Canceled) {
			if err == nil {
				q.Close()
			}
			t.Logf("QueueTo with an ended context: %v (the answer came first)", err)
		}
	}
	waitFor(t, "the daemon to hold none of the client's queues", func() bool { return daemonVQs(e, c) == 0 })
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
}

// TestRegisterGivenUp: a RegMR that times out before krcored answers
// leaves no registration in the daemon once the answer comes.
func TestRegisterGivenUp(t *testing.T) {
	e := startEnv(t)
	c, err := client.Attach(ctxT(t), client.Options{Socket: e.sock, CallTimeout: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 10 {
		if m, err := c.RegMR(4096, verbs.AccessLocalWrite); err == nil {
			t.Log("RegMR answered within a nanosecond")
			c.Deregister(m)
		}
	}
	waitFor(t, "the daemon to hold none of the client's MRs", func() bool { return clientStatus(e, c).MRs == 0 })
}

// TestExportGivenUp: an Export that times out before krcored answers
// leaves the name free once the answer comes: exporting it again works.
func TestExportGivenUp(t *testing.T) {
	e := startEnv(t)
	c := attach(t, e)
	m, err := c.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	client.SetCallTimeout(c, time.Nanosecond)
	for range 10 {
		if err := c.Export("given-up", m, 0, 64, verbs.AccessRemoteRead); err == nil {
			t.Log("Export answered within a nanosecond")
			c.Unexport("given-up")
		}
	}
	client.SetCallTimeout(c, 10*time.Second)
	// The daemon answers a client's calls in turn: once this one is
	// answered, the given-up Exports were too: none is made after.
	c.Stats()
	waitFor(t, "the daemon to hold none of the client's exports", func() bool { return len(clientStatus(e, c).Exports) == 0 })
	if err := c.Export("given-up", m, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatalf("exporting the name again: %v", err)
	}
}
