package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestCredits: a VQ cannot have more requests in flight than its credits;
// Push says so clearly, or waits (polling completions itself) when asked.
func TestCredits(t *testing.T) {
	c := start(t, 2, core.Config{Credits: 4, RCPeers: -1})
	a := c.Node(1)
	serve(t, c.Node(2), "r", 64)
	g, _ := a.Region(ctx(t), 2, "r")
	q := mustQueue(t, a, 2)
	local, _ := a.RegMR(64, verbs.AccessAll)
	req := krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}
	reqs := []krcore.Request{req, req, req, req, req, req}
	n, err := q.Push(ctx(t), false, reqs...)
	if n != 4 || !errors.Is(err, krcore.ErrNoCredit) {
		t.Fatalf("Push of 6 with 4 credits: accepted %d, err %v", n, err)
	}
	// Waiting: completions return credits without the caller popping.
	if n, err := q.Push(ctx(t), true, reqs[:2]...); n != 2 || err != nil {
		t.Fatalf("waiting Push: %d, %v", n, err)
	}
	// Completions not popped count too: 4 credits' worth, then Push waits
	// for a pop that never comes and its context ends.
	for i := 0; ; i++ {
		short, cancel := context.WithTimeout(ctx(t), 50*time.Millisecond)
		_, err := q.Push(short, true, req)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil || i > 100 {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	if n := q.Outstanding(); n != 16 {
		t.Fatalf("Push blocked with %d completions unpopped, want 16 (4 credits' worth)", n)
	}
	out := make([]krcore.Completion, 64)
	got := 0
	for got < 16 {
		k, err := q.PopWait(ctx(t), out)
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
	if q.Outstanding() != 0 {
		t.Errorf("%d requests outstanding after popping all", q.Outstanding())
	}
}
