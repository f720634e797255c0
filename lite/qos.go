package lite

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
)

// Priority is a caller's class at its Node's QoS gate (SetQoS): High, the
// default of every Node method, or Low, the class of a Caller made with
// WithPriority(Low).
type Priority uint8

const (
	// High is never delayed by the gate; its load and latency steer Low's.
	High Priority = iota
	// Low is admitted at the rate the gate allows while High works.
	Low
)

// String names the priority.
func (p Priority) String() string {
	switch p {
	case High:
		return "high"
	case Low:
		return "low"
	}
	return fmt.Sprintf("priority(%d)", uint8(p))
}

// Caller is a Node's data path used at one priority: its Read, Write and
// Call are the Node's, admitted by the Node's QoS gate as that priority.
type Caller struct {
	n *Node
	p Priority
}

// WithPriority returns a Caller whose operations run at priority p (one
// that is neither High nor Low fails them with krcore.ErrInvalid). The
// Node's own methods run at High.
func (n *Node) WithPriority(p Priority) *Caller { return &Caller{n: n, p: p} }

// Read is Node.Read at c's priority.
func (c *Caller) Read(ctx context.Context, h Handle, off int, buf []byte) error {
	if err := c.valid(); err != nil {
		return err
	}
	return c.n.Read(withPriority(ctx, c.p), h, off, buf)
}

// Write is Node.Write at c's priority.
func (c *Caller) Write(ctx context.Context, h Handle, off int, buf []byte) error {
	if err := c.valid(); err != nil {
		return err
	}
	return c.n.Write(withPriority(ctx, c.p), h, off, buf)
}

// Call is Node.Call at c's priority.
func (c *Caller) Call(ctx context.Context, node krcore.NodeID, id uint32, req, resp []byte) (int, error) {
	if err := c.valid(); err != nil {
		return 0, err
	}
	return c.n.Call(withPriority(ctx, c.p), node, id, req, resp)
}

func (c *Caller) valid() error {
	if c.p > Low {
		return fmt.Errorf("lite: %v is neither high nor low: %w", c.p, krcore.ErrInvalid)
	}
	return nil
}

// SetQoS turns the Node's QoS gate on or off (off when the Node opens).
// On, it admits Low operations at a rate it derives, window by window,
// from what High did (LITE's three policies, see qosPolicy.next); off,
// every priority goes through unchecked.
func (n *Node) SetQoS(on bool) { n.qos.set(on) }

// QoSRate reports the rate, in bytes per second, the gate now allows Low
// (+Inf: not throttled).
func (n *Node) QoSRate() float64 { return n.qos.rate() }

type priorityKey struct{}

func withPriority(ctx context.Context, p Priority) context.Context {
	if p == High {
		return ctx
	}
	return context.WithValue(ctx, priorityKey{}, p)
}

func priorityOf(ctx context.Context) Priority {
	p, _ := ctx.Value(priorityKey{}).(Priority)
	return p
}

// qosPolicy decides Low's rate from one window of observations; it does no
// I/O and reads no clock, so that it is tested on its own (qos_internal_test).
type qosPolicy struct {
	Window    time.Duration // length of an observation window
	HeavyOps  int           // High ops per second from which High's load is heavy (policy 1)
	HeavyRate float64       // Low's cap, bytes/s, while High's load is heavy
	MinRate   float64       // Low's floor, bytes/s: Low is slowed, never stopped
	Margin    float64       // High latency above baseline*Margin is a rise (policy 3)
	Decrease  float64       // factor on Low's rate at a rise
	Increase  float64       // bytes/s added to Low's rate per window without one
}

// defaultQoS suits the soft RNIC: 8-byte READs take ~15-30 us, a 64 KiB
// READ a few times that.
var defaultQoS = qosPolicy{
	Window:    10 * time.Millisecond,
	HeavyOps:  5000,
	HeavyRate: 64 << 20,
	MinRate:   256 << 10,
	Margin:    1.2,
	Decrease:  0.5,
	Increase:  1 << 20,
}

// qosWindow is what the gate observed during one window.
type qosWindow struct {
	length   time.Duration
	highOps  int
	highLat  time.Duration // High's p99 latency in the window (0: no ops)
	lowBytes int64         // bytes Low moved
}

// qosState is what the policy carries from window to window.
type qosState struct {
	rate     float64       // Low's allowed bytes/s; +Inf: not throttled
	baseline time.Duration // High's latency when it runs alone (0: not yet seen)
}

// next is LITE's three policies applied to window w:
//  2. no High op in the window: Low is not throttled at all;
//  1. High's load is heavy: Low's rate is capped at HeavyRate;
//  3. High's latency rose above its baseline by more than Margin: Low's
//     rate is cut by Decrease, else raised by Increase (AIMD).
//
// A Low not throttled stays so while High's load is light and its latency
// has not risen; once throttled, it starts from the rate it had in the
// window, or HeavyRate if that is more.
//
// The baseline is High's latency in windows where Low moved nothing (an
// average), or, until there was one, in the first window High ran. It is
// not lowered to a lower latency seen while Low ran: one quiet window on a
// noisy machine would make every later one a rise.
func (p qosPolicy) next(s qosState, w qosWindow) qosState {
	if w.highOps == 0 {
		return qosState{rate: math.Inf(1), baseline: s.baseline}
	}
	switch {
	case w.lowBytes == 0 && s.baseline == 0:
		s.baseline = w.highLat
	case w.lowBytes == 0:
		s.baseline = (3*s.baseline + w.highLat) / 4
	case s.baseline == 0:
		s.baseline = w.highLat
	}
	heavy := w.length > 0 && float64(w.highOps) >= float64(p.HeavyOps)*w.length.Seconds()
	rise := w.highLat > time.Duration(float64(s.baseline)*p.Margin)
	r := s.rate
	if math.IsInf(r, 1) {
		if !heavy && !rise || w.length == 0 {
			return s
		}
		r = max(float64(w.lowBytes)/w.length.Seconds(), p.HeavyRate)
	}
	if rise {
		r *= p.Decrease
	} else {
		r += p.Increase
	}
	if heavy {
		r = min(r, p.HeavyRate)
	}
	s.rate = max(r, p.MinRate)
	return s
}

// maxSamples bounds the High latencies a window keeps for its p99.
const maxSamples = 2048

// qosGate is a Node's admission control at the sender: High's operations
// are timed, Low's wait for tokens of a bucket refilled at the policy's
// rate. Its zero value is a gate that is off.
type qosGate struct {
	on atomic.Bool

	mu       sync.Mutex
	pol      qosPolicy
	st       qosState
	start    time.Time // of the current window
	lastHigh time.Time // end of High's last op
	win      qosWindow
	lats     []time.Duration
	tokens   float64 // bytes Low may send now; negative: owed
	refill   time.Time
	changed  chan struct{} // closed (and replaced) when the rate changes or the gate closes
	closed   bool
}

func (g *qosGate) set(on bool) {
	g.mu.Lock()
	if g.pol.Window == 0 {
		g.pol = defaultQoS
	}
	now := time.Now() // High's baseline is kept: it is the machine's, not the gate's
	g.st.rate, g.start, g.win, g.lats, g.tokens, g.refill = math.Inf(1), now, qosWindow{}, g.lats[:0], 0, now
	g.mu.Unlock()
	g.on.Store(on)
}

func (g *qosGate) rate() float64 {
	if !g.on.Load() {
		return math.Inf(1)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.roll(time.Now())
	return g.st.rate
}

// close fails Low's waiters, and every Low operation after, with
// krcore.ErrClosed.
func (g *qosGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.notify()
}

func (g *qosGate) notify() {
	if g.changed != nil {
		close(g.changed)
	}
	g.changed = make(chan struct{})
}

// qosTicket is an admitted operation; done records it if it was High.
type qosTicket struct {
	g *qosGate // nil: nothing to record
	t time.Time
}

// done records the operation's end.
func (k qosTicket) done() {
	if k.g != nil {
		k.g.high(k.t, time.Now())
	}
}

// enter admits an operation of size bytes at ctx's priority: Low waits for
// its tokens (honouring ctx; a closing Node fails it with krcore.ErrClosed),
// High goes at once, timed by the ticket's done.
func (g *qosGate) enter(ctx context.Context, size int) (qosTicket, error) {
	if !g.on.Load() {
		return qosTicket{}, nil
	}
	if priorityOf(ctx) == Low {
		return qosTicket{}, g.admit(ctx, size)
	}
	return qosTicket{g: g, t: time.Now()}, nil
}

// high records one High operation that ran from t to now.
func (g *qosGate) high(t, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.roll(now)
	g.win.highOps++
	g.lastHigh = now
	if len(g.lats) < maxSamples {
		g.lats = append(g.lats, now.Sub(t))
	}
}

// admit waits until Low may move size bytes: it spins briefly for a short
// wait and sleeps for a longer one, at most a window at a time, since the
// rate may change (to +Inf when High went idle) at the next window.
func (g *qosGate) admit(ctx context.Context, size int) error {
	for spins := 0; ; spins++ {
		wait, changed, err := g.take(time.Now(), size)
		if err != nil || wait == 0 {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if wait < 50*time.Microsecond && spins < 64 {
			runtime.Gosched()
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// take takes size bytes of tokens if the bucket is not in debt, or returns
// how long to wait before trying again and a channel closed if the rate
// changes before.
func (g *qosGate) take(now time.Time, size int) (time.Duration, <-chan struct{}, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, nil, fmt.Errorf("lite: low-priority operation: %w", krcore.ErrClosed)
	}
	g.roll(now)
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	if math.IsInf(g.st.rate, 1) {
		g.win.lowBytes += int64(size)
		return 0, nil, nil
	}
	g.tokens = min(g.tokens+g.st.rate*now.Sub(g.refill).Seconds(), g.st.rate*g.pol.Window.Seconds())
	g.refill = now
	if g.tokens >= 0 {
		g.tokens -= float64(size)
		g.win.lowBytes += int64(size)
		return 0, nil, nil
	}
	wait := time.Duration(-g.tokens / g.st.rate * float64(time.Second))
	return min(max(wait, time.Microsecond), g.pol.Window), g.changed, nil
}

// roll closes the current window if it lasted Window, and applies the
// policy to it; g.mu held. A window is closed lazily, by the next op or
// waiter: when more than two Windows passed, the window is closed a Window
// in, or at High's last op if later, and the quiet stretch after it, when
// it is a Window or longer, is a window of its own (policy 2 then lifts
// the throttle at once, not a Window after the stretch ends).
func (g *qosGate) roll(now time.Time) {
	w := g.pol.Window
	if w == 0 || now.Sub(g.start) < w {
		return
	}
	if end := latest(g.start.Add(w), g.lastHigh); now.Sub(end) >= w {
		g.closeWindow(end)
	}
	g.closeWindow(now)
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// closeWindow applies the policy to the window ending at end; g.mu held.
func (g *qosGate) closeWindow(end time.Time) {
	g.win.length = end.Sub(g.start)
	g.win.highLat = p99(g.lats)
	old := g.st.rate
	g.st = g.pol.next(g.st, g.win)
	if math.IsInf(old, 1) && !math.IsInf(g.st.rate, 1) {
		g.tokens, g.refill = 0, end // a bucket just throttled starts empty
	}
	if g.st.rate != old {
		g.notify()
	}
	g.start, g.win, g.lats = end, qosWindow{}, g.lats[:0]
}

// p99 is the 99th percentile of lats (sorted in place); 0 for none.
func p99(lats []time.Duration) time.Duration {
	if len(lats) == 0 {
		return 0
	}
	slices.Sort(lats)
	return lats[(len(lats)*99)/100]
}
