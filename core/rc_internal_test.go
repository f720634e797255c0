package core

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/meta"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestBuildRCCall: the RC handshake over the control port connects both
// ends and puts the QP in the initiator's pool.
func TestBuildRCCall(t *testing.T) {
	ctx, a, _ := rcPair(t, 20*time.Second)
	p, err := a.peerFor(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.buildRC(ctx, p); err != nil {
		t.Fatal(err)
	}
	if len(p.rcs()) != 1 {
		t.Fatal("no RC")
	}
}

// TestRetireRCPeerSilent: an RC QP retired while its peer has gone
// silent, not yet known dead, is destroyed once the close call finds the
// peer dead (the call confirms the death, then fails with the silence):
// it stayed "closing" for good, its other end never answering.
func TestRetireRCPeerSilent(t *testing.T) {
	retireSilent(t, func(a *Runtime, pq *pqp) { a.evictRC(pq) })
}

// TestRetireRCDeadlinePast: the same when the close call's deadline ends
// it before it has tried often enough to call the peer silent, as on a
// loaded node whose retiring goroutine did not run for most of the
// deadline (here the deadline has passed before the call): the peer is
// pinged, found dead, and the QP destroyed.
func TestRetireRCDeadlinePast(t *testing.T) {
	retireSilent(t, func(a *Runtime, pq *pqp) {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		if !pq.rc.dropRC(pq) {
			t.Fatal("the RC QP was not in its peer's pool")
		}
		a.retireRC(ctx, pq)
	})
}

// retireSilent builds an RC QP from node 1 to node 2, silences node 2 and
// retires the QP with retire: the peer must be found dead and the QP
// destroyed.
func retireSilent(t *testing.T, retire func(a *Runtime, pq *pqp)) {
	ctx, a, b := rcPair(t, 20*time.Second)
	p, err := a.peerFor(ctx, 2)
	if err == nil {
		err = a.buildRC(ctx, p)
	}
	if err != nil {
		t.Fatal(err)
	}
	pq := p.rcs()[0]
	b.Close() // silent from now on; a learns it only by asking
	if p.deadErr() != nil {
		t.Fatal("the peer is known dead before the close call: nothing to test")
	}
	retire(a, pq)
	if p.deadErr() == nil {
		t.Fatal("the close call did not find the peer dead")
	}
	for _, s := range a.PoolQPs() {
		if s.Type == QPTypeRC {
			t.Errorf("RC QP to the silent peer left %s", s.State)
		}
	}
	pq.mu.Lock()
	destroyed := pq.destroyed
	pq.mu.Unlock()
	if !destroyed {
		t.Error("RC QP to the silent peer not destroyed")
	}
}

// rcPair is runtimes 1 and 2 in RC-only mode on one soft fabric, 2 knowing
// 1, and a context of d for the test; all are closed or cancelled when the
// test ends. The path is patient: on two loaded cores under -race, a 50 ms
// one failed the set-up (the acceptor's lookup of node 1 ran out its
// 400 ms, and it refused the RC connection).
func rcPair(t *testing.T, d time.Duration) (ctx context.Context, a, b *Runtime) {
	t.Helper()
	fab := soft.NewFabric()
	var devs [2]verbs.Device
	for i := range devs {
		dev, err := fab.NewNode(soft.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		devs[i] = dev
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	path := verbs.Path{Timeout: 500 * time.Millisecond, RetryCount: 3}
	a, err := New(ctx, Config{Device: devs[0], Node: 1, Path: path, RCPeers: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = New(ctx, Config{Device: devs[1], Node: 2, Path: path, Meta: []meta.Info{a.MetaInfo()}, RCPeers: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return ctx, a, b
}
