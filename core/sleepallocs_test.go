//go:build !race

// The race detector allocates on its own account (1 a request here):
// allocation counts hold without it.

package core_test

import (
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestSleepingPopWaitAllocs: a request whose PopWait sleeps on the
// completion queue and is woken by its completion allocates nothing: the
// waiter's own dispatch of the completion does not cancel its sleep
// context, so the next sleep reuses it and its registrations (with the
// caller's context and with the provider) instead of making them anew.
// Two soft nodes in one process with listen addresses reach each other
// over a shared-memory link, whose completions a waiter reads in CQ.Wait.
func TestSleepingPopWaitAllocs(t *testing.T) {
	ctx := ctx(t)
	_, rts := tcpRuntimes(t, 2, core.Config{RCPeers: -1})
	a := rts[0]
	q, req := vqReader(t, a, rts[1])
	var out [1]krcore.Completion
	read := func() {
		if err := q.PushOne(ctx, false, req); err != nil {
			t.Fatal(err)
		}
		if _, err := q.PopWait(ctx, out[:]); err != nil {
			t.Fatal(err)
		}
		if out[0].Status != verbs.Success {
			t.Fatal(out[0].Status)
		}
	}
	for range 100 {
		read()
	}
	// AllocsPerRun counts the whole process's allocations: on a starved
	// machine the runtimes' own background work (leases, probes) lands
	// in one run now and then (1.0 a request once at load ~25). A request
	// that allocates does so in every run, so the fewest of three is its.
	const runs = 300
	fewest := -1.0
	for range 3 {
		before := core.SendSleeps(a)
		n := testing.AllocsPerRun(runs, read)
		if slept := core.SendSleeps(a) - before; slept < runs/2 {
			t.Fatalf("PopWait slept %d times in %d requests: the test needs it to sleep", slept, runs+1)
		}
		if fewest < 0 || n < fewest {
			fewest = n
		}
		if fewest == 0 {
			return
		}
	}
	t.Errorf("a request whose PopWait sleeps allocates %.1f times (the fewest of 3 runs)", fewest)
}
