package core_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// hammer keeps READs going on q until stop closes, as an application that
// does not know its peer died would.
func hammer(q *core.Queue, req krcore.Request, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	var out [16]krcore.Completion
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	for ctx.Err() == nil {
		if _, err := q.Push(ctx, true, req); err != nil {
			continue
		}
		if n, _ := q.PopWait(ctx, out[:]); n > 0 && out[0].Status != verbs.Success {
			time.Sleep(time.Millisecond) // an application's back-off, not a synchronisation
		}
	}
}

// TestDeadPeerSparesControlPath: node 1 holds an RC QP to a hot node 3,
// which dies while node 1 keeps sending to it; control calls from node 1
// to the live node 2 (region lookups) and from node 2 to node 1 keep
// answering within a control round trip's retries, not after the dead
// peer's timeouts.
//
// The bound is the dead peer's retry budget (Path.Timeout times its
// RetryCount+1 sends), made long here: a control call that waited on the
// dead peer's retries takes at least that long, while one that did not
// takes a round trip plus whatever the scheduler adds. Under -race on two
// loaded cores, at nice 19 beside busy loops, that addition reached 3.8 s
// (a 20 ms attempt's timer fired 838 ms late, a reply's send took 626 ms:
// the process starved, waiting on nothing), past a budget of 1 s. The
// budget is 8 s, and the calls are timed for 3 s after the death, while
// the dead peer's requests are being retried.
func TestDeadPeerSparesControlPath(t *testing.T) {
	path := verbs.Path{Timeout: 2 * time.Second, RetryCount: 3}
	budget := path.Timeout * time.Duration(path.RetryCount+1)
	// Lease: node 2's 2 s lease lapsed once, its renewal starved, and a
	// lookup of the live node found no record.
	c := start(t, 3, core.Config{DCIs: 2, HotOps: 2, HotWindow: 2 * time.Millisecond, Path: path, Lease: 10 * time.Second})
	a, b := c.Node(1), c.Node(2)
	serve(t, b, "live", 64)
	q3, req3 := reader(t, a, c.Node(3), "dead")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go hammer(q3, req3, stop, &wg)
	}
	defer func() { close(stop); wg.Wait() }()
	deadline := time.Now().Add(20 * time.Second) // the RC handshake, starved
	for a.Stats().RCs == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no RC QP to the hot peer: %+v", a.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Remove(3, true); err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		for _, call := range []struct {
			from *core.Runtime
			to   krcore.NodeID
			name string
		}{{a, 2, "live"}, {b, 1, "none"}} {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			t0 := time.Now()
			_, err := call.from.Region(cctx, call.to, call.name)
			d := time.Since(t0)
			cancel()
			if err != nil && !errors.Is(err, krcore.ErrNoRegion) {
				t.Fatalf("region %q of live node %d from node %d after %v: %v", call.name, call.to, call.from.Node(), d, err)
			}
			worst = max(worst, d)
		}
	}
	t.Logf("slowest control call to a live node while node 3 lay dead: %v; stats %+v", worst, a.Stats())
	if worst >= budget {
		t.Errorf("a control call to a live node took %v, the dead peer's retry budget %v or more, while it was being retried", worst, budget)
	}
}

// TestDeadPeerFailsFast: once a peer is found dead, what is addressed to
// it fails at once (requests with RETRY_EXC_ERR, control calls and
// connects with an error naming it that matches ErrPeerDead) instead of
// after a retry timeout each; when the node comes back (restarted under
// the same id) the runtime finds it alive again and traffic resumes.
//
// "At once" is told by what each round did, not by a clock (a round of
// microseconds took 183 ms on two loaded cores under -race): the READ is
// refused before it is posted (a refusal, where one sent fails only after
// the transport's timeout and counts none), and Region and Connect stop at
// the peer's death before any call (ErrPeerDead: a call that went out and
// waited fails with no reply). patientPath: a READ of the set-up stalled
// past the default 200 ms would find the live node dead.
func TestDeadPeerFailsFast(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		rc := core.Config{DCIs: 1, RCPeers: -1, Path: patientPath}
		c := m.start(t, 3, rc)
		a := c.Node(1)
		q, req := reader(t, a, c.Node(3), "r")
		if _, err := q.Push(ctx(t), true, req); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, q); wc.Status != verbs.Success {
			t.Fatalf("READ before the death: %+v", wc)
		}
		if err := c.Remove(3, true); err != nil {
			t.Fatal(err)
		}
		// The first request finds the death, after the transport's timeout.
		if _, err := q.Push(ctx(t), true, req); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, q); wc.Status == verbs.Success {
			t.Fatalf("READ from a dead node: %+v", wc)
		} else {
			t.Logf("first READ from the dead node: %v", wc.Status)
		}
		var slowest time.Duration
		defer func() { t.Logf("slowest round (READ, Region, Connect) against the dead node: %v", slowest) }()
		for i := range 5 {
			refused := a.Stats().Refusals
			t0 := time.Now()
			if _, err := q.Push(ctx(t), true, req); err != nil {
				t.Fatal(err)
			}
			if wc := pop1(t, q); wc.Status != verbs.RetryExcErr {
				t.Fatalf("READ %d from a dead node: %+v, want RETRY_EXC_ERR", i, wc)
			}
			_, rerr := a.Region(ctx(t), 3, "r")
			q2, _ := a.Queue()
			cerr := q2.Connect(ctx(t), 3, nil)
			q2.Close()
			slowest = max(slowest, time.Since(t0))
			if n := a.Stats().Refusals - refused; n != 1 {
				t.Errorf("round %d: %d requests refused, want its READ refused before it was posted", i, n)
			}
			for what, err := range map[string]error{"Region": rerr, "Connect": cerr} {
				if !errors.Is(err, krcore.ErrPeerDead) || !strings.Contains(err.Error(), "node 3") {
					t.Errorf("%s of a dead node: %v, want ErrPeerDead naming node 3", what, err)
				}
			}
		}
		if n := a.Stats().PeersDead; n != 1 {
			t.Errorf("PeersDead %d, want 1", n)
		}

		// Node 3 comes back: the probe finds it, and the same queue reads
		// from its new region.
		if err := c.Add(ctx(t), m.config(3, rc), 3); err != nil {
			t.Fatal(err)
		}
		serve(t, c.Node(3), "r", 64)
		t0 := time.Now()
		var g krcore.Region
		for {
			var err error
			if g, err = a.Region(ctx(t), 3, "r"); err == nil {
				break
			}
			if !errors.Is(err, krcore.ErrPeerDead) || time.Since(t0) > 5*time.Second {
				t.Fatalf("region of node 3 %v after its restart: %v", time.Since(t0), err)
			}
			time.Sleep(5 * time.Millisecond) // the probe runs on its own schedule
		}
		t.Logf("node 3 known alive %v after its restart", time.Since(t0))
		req.Remote = g.At(0)
		if _, err := q.Push(ctx(t), true, req); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, q); wc.Status != verbs.Success {
			t.Fatalf("READ after the restart: %+v", wc)
		}
	}, modeDC, modeNoDC)
}
