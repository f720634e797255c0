package soft

import (
	"testing"
	"time"
)

// TestSweepDue: a sweep that comes after a stall of the process expires
// nothing (the responses that came meanwhile may still be unread), but
// never two in a row, so a process that stalls at every tick still fails
// overdue requests within two sweeps.
func TestSweepDue(t *testing.T) {
	const p = 25 * time.Millisecond
	steps := []struct {
		since time.Duration
		due   bool
	}{
		{p, true},        // on time
		{2 * p, true},    // one tick dropped: not yet a stall
		{2*p + 1, false}, // a stall: skipped
		{p, true},        // the next, on time, judges
		{10 * p, false},  // another stall
		{10 * p, true},   // and at once another: not skipped twice
		{10 * p, false},  // a third: skipped again, after a sweep that ran
		{p + p/2, true},
	}
	skipped := false
	for i, s := range steps {
		var due bool
		due, skipped = sweepDue(s.since, p, skipped)
		if due != s.due {
			t.Fatalf("step %d (%v after the last sweep): due %v, want %v", i, s.since, due, s.due)
		}
	}
}
