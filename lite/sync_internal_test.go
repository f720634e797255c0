package lite

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestCloseDuringAtomic: Close while FetchAdds wait on a master that was
// killed wakes them and leaves no queue of the sync path behind.
func TestCloseDuringAtomic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api := core.Embed(c.Node(1))
	before := api.Stats().VQs
	master, err := Open(ctx, core.Embed(c.Node(2)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.Malloc(ctx, "w", 8, Atomic); err != nil {
		t.Fatal(err)
	}
	mapper, err := Open(ctx, api, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := mapper.Map(ctx, 2, "w", Atomic)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mapper.FetchAdd(ctx, h, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(2, true); err != nil { // the master's node dies
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !mapper.isClosed() {
			mapper.FetchAdd(ctx, h, 0, 1)
		}
	}()
	for mapper.sync.mu.TryLock() { // until a FetchAdd holds the sync queue
		mapper.sync.mu.Unlock()
	}
	mapper.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a FetchAdd still waits 5 s after Close")
	}
	if got := api.Stats().VQs; got != before {
		t.Fatalf("%d VQs after Close, %d before Open", got, before)
	}
}

// TestDecide: a waiter's move on the lock's state, as a pure function.
func TestDecide(t *testing.T) {
	const lease = time.Second
	at := func(s uint32, held bool) uint64 { return serving(0, s, held) }
	for _, c := range []struct {
		name    string
		t       uint32
		w       uint64
		silence time.Duration
		pass    bool
		want    move
	}{
		{"my turn, free", 5, at(5, false), 0, false, take},
		{"my turn, free, handing on", 5, at(5, false), 0, true, take},
		{"my turn, held", 5, at(5, true), 0, false, stay},
		{"behind a holder", 6, at(5, true), lease / 2, false, stay},
		{"behind a silent holder", 6, at(5, true), lease + 1, false, take},
		{"behind a silent holder, handing on", 6, at(5, true), 10 * lease, true, stay},
		{"two behind a silent holder, one lease", 7, at(5, true), lease + 1, false, stay},
		{"two behind a silent holder, two leases", 7, at(5, true), 2*lease + 1, false, take},
		{"behind an unclaimed ticket", 6, at(5, false), lease + 1, false, take},
		{"passed over", 4, at(5, true), 0, false, requeue},
		{"past the wrap", 1, at(tickMask, true), 0, false, stay},
		{"passed over across the wrap", tickMask, at(1, false), 0, false, requeue},
	} {
		if got := decide(c.t, c.w, c.silence, lease, c.pass); got != c.want {
			t.Errorf("%s: %d", c.name, got)
		}
	}
	if w := serving(uint64(7)<<nextShift, 3, true); nextOf(w) != 7 || servingOf(w) != 3 || !heldOf(w) {
		t.Fatalf("serving: next %d, serving %d, held %v", nextOf(w), servingOf(w), heldOf(w))
	}
	if w := uint64(tickMask) << nextShift; nextOf(w+oneTicket) != 0 {
		t.Fatalf("the next ticket after %d is %d, want 0", tickMask, nextOf(w+oneTicket))
	}
}

// TestQuiet: a lock's silence ends when the served ticket, the held bit
// or the beat changes, whether seen by a READ or in a failed CompareSwap's
// answer, and not when a ticket is only taken.
func TestQuiet(t *testing.T) {
	t0 := time.Unix(100, 0)
	q := newQuiet(t0, time.Minute)
	w := serving(0, 5, true)
	q.see(w, 7, t0)
	q.see(w+oneTicket, 7, t0.Add(time.Second)) // a ticket taken
	if q.since != t0 {
		t.Fatalf("queuing ended the silence: since %v", q.since)
	}
	for i, next := range []struct {
		w    uint64
		beat uint64
	}{{w, 8}, {serving(w, 6, false), 8}, {serving(w, 6, true), 8}} {
		at := t0.Add(time.Duration(i+2) * time.Second)
		q.see(next.w, next.beat, at)
		if q.since != at {
			t.Fatalf("change %d did not end the silence", i)
		}
	}
}

// TestQuietAbsent: a gap between two looks longer than absent (the
// waiter did not run) counts only up to absent toward the silence.
func TestQuietAbsent(t *testing.T) {
	t0 := time.Unix(100, 0)
	q := newQuiet(t0, 10*time.Millisecond)
	w := serving(0, 5, true)
	q.see(w, 7, t0)
	for i := 1; i <= 3; i++ { // looks 5 ms apart: all silence
		q.see(w, 7, t0.Add(time.Duration(5*i)*time.Millisecond))
	}
	if got := q.silence(); got != 15*time.Millisecond {
		t.Fatalf("silence %v after looks 5 ms apart, want 15ms", got)
	}
	q.see(w, 7, t0.Add(515*time.Millisecond)) // the waiter was away 500 ms
	if got := q.silence(); got != 25*time.Millisecond {
		t.Fatalf("silence %v across a 500 ms gap, want 25ms (10 ms of the gap)", got)
	}
	q.see(w, 8, t0.Add(520*time.Millisecond)) // a renewal seen
	if got := q.silence(); got != 0 {
		t.Fatalf("silence %v after a new beat, want 0", got)
	}
}
