package rawqp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// connected is two endpoints on two soft nodes of one in-memory fabric,
// their RC QPs connected to each other, and a poller for each.
func connected(t *testing.T, size int, sh Shape) (a, b *Endpoint, pa, pb *Poller) {
	t.Helper()
	fab := soft.NewFabric()
	var eps [2]*Endpoint
	var ps [2]*Poller
	for i := range eps {
		dev, err := fab.NewNode(soft.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		if eps[i], err = NewEndpoint(dev, nil, size, sh); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eps[i].Close() })
		ps[i] = NewPoller(context.Background(), eps[i].CQ, 0, 10*time.Second, true)
		t.Cleanup(ps[i].Close)
	}
	for i, e := range eps {
		if err := e.Connect(eps[1-i].QP.Endpoint()); err != nil {
			t.Fatal(err)
		}
	}
	return eps[0], eps[1], ps[0], ps[1]
}

// TestLoops: a READ one at a time sees the peer's bytes, a window of
// WRITEs lands and reports its marks up to the total, and a ping-pong
// against the peer's echo completes every round trip.
func TestLoops(t *testing.T) {
	a, b, pa, pb := connected(t, 4096, Shape{SendDepth: 16, RecvDepth: 16})
	copy(b.MR.Bytes(), "peer's bytes")
	lat, err := a.Latency(pa, Spec{Op: verbs.OpRead, Size: 12, Remote: *b.Remote()}, 2, 5)
	if err != nil || len(lat) != 5 || string(a.MR.Bytes()[:12]) != "peer's bytes" {
		t.Fatalf("READ latency: %d samples, %v, read %q", len(lat), err, a.MR.Bytes()[:12])
	}
	copy(a.MR.Bytes(), "written")
	marks, err := a.Stream(pa, Spec{Op: verbs.OpWrite, Size: 7, Remote: *b.Remote()}, 40, 8, 4)
	if err != nil || len(marks) < 2 || marks[len(marks)-1].Msgs != 40 || string(b.MR.Bytes()[:7]) != "written" {
		t.Fatalf("WRITE stream: %v, marks %v, peer holds %q", err, marks, b.MR.Bytes()[:7])
	}
	for _, e := range []*Endpoint{a, b} {
		if err := e.PostRecvs(16); err != nil {
			t.Fatal(err)
		}
	}
	echoed := make(chan error, 1)
	go func() { echoed <- b.Echo(pb, 64, 10) }()
	rtts, err := a.PingPong(pa, 64, 2, 8)
	if err != nil || len(rtts) != 8 {
		t.Fatalf("ping-pong: %d round trips, %v", len(rtts), err)
	}
	if err := <-echoed; err != nil {
		t.Fatalf("echo: %v", err)
	}
}

// TestPollerGivesUp: a wait for a completion that never comes ends after
// the poller's timeout with ErrNoCompletion, not a hang.
func TestPollerGivesUp(t *testing.T) {
	a, _, _, _ := connected(t, 4096, Shape{SendDepth: 4, RecvDepth: 4})
	p := NewPoller(context.Background(), a.CQ, time.Millisecond, 100*time.Millisecond, false)
	defer p.Close()
	t0 := time.Now()
	if _, err := p.Next(); !errors.Is(err, ErrNoCompletion) || time.Since(t0) > 5*time.Second {
		t.Errorf("Next on an idle CQ: %v after %v, want ErrNoCompletion", err, time.Since(t0))
	}
}
