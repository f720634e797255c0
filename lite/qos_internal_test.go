package lite

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/krcore/krcore"
)

// P99 is p99 for the external tests.
var P99 = p99

// TestQoSPolicy drives the policy alone through LITE's three policies.
func TestQoSPolicy(t *testing.T) {
	p := qosPolicy{Window: 10 * time.Millisecond, HeavyOps: 1000, HeavyRate: 100, MinRate: 10,
		Margin: 1.2, Decrease: 0.5, Increase: 5}
	inf := math.Inf(1)
	us := time.Microsecond
	w := func(ops int, lat time.Duration, low int64) qosWindow {
		return qosWindow{length: 10 * time.Millisecond, highOps: ops, highLat: lat, lowBytes: low}
	}
	for _, c := range []struct {
		name string
		s    qosState
		w    qosWindow
		want qosState
	}{
		{"high idle: not throttled", qosState{rate: 40, baseline: 20 * us}, w(0, 0, 1000), qosState{rate: inf, baseline: 20 * us}},
		{"high alone sets the baseline", qosState{rate: inf}, w(5, 20*us, 0), qosState{rate: inf, baseline: 20 * us}},
		{"alone windows average the baseline", qosState{rate: inf, baseline: 20 * us}, w(5, 24*us, 0), qosState{rate: inf, baseline: 21 * us}},
		{"rise with low idle: throttled from HeavyRate", qosState{rate: inf, baseline: 20 * us}, w(5, 40*us, 0), qosState{rate: 50, baseline: 25 * us}},
		{"light high, no rise: low not throttled", qosState{rate: inf, baseline: 20 * us}, w(5, 20*us, 5), qosState{rate: inf, baseline: 20 * us}},
		{"light high, rise: low throttled from its rate in the window", qosState{rate: inf, baseline: 20 * us}, w(5, 30*us, 5), qosState{rate: 250, baseline: 20 * us}},
		{"light high, rise, low slower than HeavyRate: from HeavyRate", qosState{rate: inf, baseline: 20 * us}, w(5, 30*us, 0), qosState{rate: 50, baseline: 22500 * time.Nanosecond}},
		{"heavy high caps low", qosState{rate: inf, baseline: 20 * us}, w(50, 20*us, 5), qosState{rate: 100, baseline: 20 * us}},
		{"heavy high caps a raised rate", qosState{rate: 98, baseline: 20 * us}, w(50, 20*us, 5), qosState{rate: 100, baseline: 20 * us}},
		{"latency rise halves", qosState{rate: 80, baseline: 20 * us}, w(50, 30*us, 5), qosState{rate: 40, baseline: 20 * us}},
		{"within margin: additive increase", qosState{rate: 40, baseline: 20 * us}, w(5, 23*us, 5), qosState{rate: 45, baseline: 20 * us}},
		{"floor", qosState{rate: 12, baseline: 20 * us}, w(50, 90*us, 5), qosState{rate: 10, baseline: 20 * us}},
		{"a latency while low runs leaves the baseline", qosState{rate: 40, baseline: 20 * us}, w(5, 15*us, 5), qosState{rate: 45, baseline: 20 * us}},
		{"no baseline yet: first latency with low running", qosState{rate: inf}, w(50, 60*us, 5), qosState{rate: 100, baseline: 60 * us}},
	} {
		if got := p.next(c.s, c.w); got != c.want {
			t.Errorf("%s: next(%+v, %+v) = %+v, want %+v", c.name, c.s, c.w, got, c.want)
		}
	}
}

// throttled returns a gate whose rate is low and whose bucket is in debt.
func throttled(t *testing.T) *qosGate {
	g := &qosGate{}
	g.set(true)
	g.mu.Lock()
	g.pol.Window = time.Hour // no window closes during the test
	g.st.rate = 1
	g.tokens = -1e6
	g.mu.Unlock()
	return g
}

func TestQoSWaitHonoursContext(t *testing.T) {
	g := throttled(t)
	ctx, cancel := context.WithTimeout(withPriority(context.Background(), Low), 20*time.Millisecond)
	defer cancel()
	if _, err := g.enter(ctx, 8); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("throttled Low: %v, want DeadlineExceeded", err)
	}
	k, err := g.enter(context.Background(), 8)
	if err != nil {
		t.Fatalf("High through a throttled gate: %v", err)
	}
	k.done()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.win.highOps != 1 || len(g.lats) != 1 {
		t.Fatalf("High's op not recorded: %d ops, %d latencies", g.win.highOps, len(g.lats))
	}
}

func TestQoSCloseWakesWaiters(t *testing.T) {
	g := throttled(t)
	errc := make(chan error, 1)
	go func() {
		_, err := g.enter(withPriority(context.Background(), Low), 8)
		errc <- err
	}()
	for { // until the waiter holds the channel close will close
		g.mu.Lock()
		waiting := g.changed != nil
		g.mu.Unlock()
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	g.close()
	select {
	case err := <-errc:
		if !errors.Is(err, krcore.ErrClosed) {
			t.Fatalf("waiter woken by close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not wake the waiter")
	}
	if _, err := g.enter(withPriority(context.Background(), Low), 8); !errors.Is(err, krcore.ErrClosed) {
		t.Fatalf("Low after close: %v, want ErrClosed", err)
	}
}

func TestQoSOffAdmitsAll(t *testing.T) {
	g := throttled(t)
	g.set(false)
	if _, err := g.enter(withPriority(context.Background(), Low), 1<<20); err != nil {
		t.Fatalf("Low through a gate turned off: %v", err)
	}
}

// TestQoSQuietStretch: windows closed late keep High's ops in a Window of
// their own, so the quiet stretch after them lifts the throttle.
func TestQoSQuietStretch(t *testing.T) {
	g := &qosGate{}
	g.set(true)
	g.mu.Lock()
	defer g.mu.Unlock()
	t0, w := g.start, g.pol.Window
	g.st.rate = g.pol.MinRate // throttled
	g.win.highOps, g.lastHigh = 100, t0.Add(w/2)
	g.roll(t0.Add(2*w - 1)) // one late window: High ran in it
	if math.IsInf(g.st.rate, 1) {
		t.Fatal("throttle lifted by a window High ran in")
	}
	g.st.rate, g.start, g.win.highOps, g.lastHigh = g.pol.MinRate, t0, 100, t0.Add(w/2)
	g.roll(t0.Add(2 * w)) // High's Window, then a quiet Window
	if !math.IsInf(g.st.rate, 1) {
		t.Fatalf("Low still throttled (%v B/s) after a quiet Window", g.st.rate)
	}
	if !g.start.Equal(t0.Add(2 * w)) {
		t.Fatalf("window restarted at %v, want now", g.start.Sub(t0))
	}
}
