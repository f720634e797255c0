package soft_test

import (
	"sync"
	"testing"
	"time"
)

// offCPU measures when the test process went without running: a goroutine
// that wakes every offCPUTick records each wake-up that came more than two
// ticks late as a stall. A bound on how promptly something happens,
// checked against wall time, fails at nice 19 beside busy loops for time
// in which the process did not run at all (nothing it does can be prompt
// then); checked against wall time less the stalls in it, it still fails
// a wait that sat idle while the process ran.
type offCPU struct {
	base   time.Time
	mu     sync.Mutex
	stalls [][2]time.Duration // since base: from the wake-up due to the late one
	seen   time.Duration      // since base: the last wake-up
	stop   chan struct{}
	done   chan struct{}
}

const offCPUTick = time.Millisecond

// newOffCPU starts measuring; the test's cleanup stops it.
func newOffCPU(t testing.TB) *offCPU {
	m := &offCPU{base: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	t.Cleanup(func() { close(m.stop); <-m.done })
	return m
}

func (m *offCPU) run() {
	defer close(m.done)
	tick := time.NewTicker(offCPUTick)
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		now := time.Since(m.base)
		m.mu.Lock()
		if now-m.seen > 2*offCPUTick {
			m.stalls = append(m.stalls, [2]time.Duration{m.seen + offCPUTick, now})
		}
		m.seen = now
		m.mu.Unlock()
	}
}

// running returns how long the process ran from start to end, the wall
// time less the stalls in it, and the wall time. It waits for the meter's
// first wake-up after end, which ends a stall going on then.
func (m *offCPU) running(start, end time.Time) (run, wall time.Duration) {
	from, to := start.Sub(m.base), end.Sub(m.base)
	for {
		m.mu.Lock()
		if m.seen > to {
			break
		}
		m.mu.Unlock()
		time.Sleep(offCPUTick)
	}
	defer m.mu.Unlock()
	run = to - from
	for _, s := range m.stalls {
		run -= max(min(s[1], to)-max(s[0], from), 0)
	}
	return run, to - from
}
