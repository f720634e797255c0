//go:build !race

// The race detector allocates on its own account (1 a request here):
// allocation counts hold without it.

package core

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rts []*Runtime
	for i := range 2 {
		dev, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		cfg := Config{Device: dev, Node: krcore.NodeID(i + 1), RCPeers: -1}
		if i > 0 {
			cfg.Meta = []meta.Info{rts[0].MetaInfo()}
		}
		rt, err := New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rts = append(rts, rt)
	}
	a, s := rts[0], rts[1]
	mr, err := s.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Export("r", mr, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	g, err := a.Region(ctx, s.Node(), "r")
	if err != nil {
		t.Fatal(err)
	}
	q, err := a.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, s.Node(), nil); err != nil {
		t.Fatal(err)
	}
	local, err := a.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	req := krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}
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
	const runs = 300
	before := a.sends.sleeps.Load()
	n := testing.AllocsPerRun(runs, read)
	if slept := a.sends.sleeps.Load() - before; slept < runs/2 {
		t.Fatalf("PopWait slept %d times in %d requests: the test needs it to sleep", slept, runs+1)
	}
	if n != 0 {
		t.Errorf("a request whose PopWait sleeps allocates %.1f times", n)
	}
}
