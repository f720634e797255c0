//go:build !race

// The race detector allocates on its own account: allocation counts hold
// without it.

package client

import (
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// TestPushOnePopWaitAllocs: a request's hot calls on the client's side of
// krcored, PushOne and a PopWait that sleeps on the completion bell until
// the daemon rings it, allocate nothing. The daemon here is a goroutine
// that sleeps on the VQ's doorbell and completes every SQE on the ring, as
// the pump does, so both sides' bells sleep and ring for every request.
// A bell's sleep and ring allocate nothing once the sleep's context is
// registered.
func TestPushOnePopWaitAllocs(t *testing.T) {
	v := ringVQ(t)
	ctx := pump(t, v)

	req := krcore.Request{Op: verbs.OpRead}
	out := make([]krcore.Completion, 1)
	read := func() {
		req.ID++
		if err := v.PushOne(ctx, false, req); err != nil {
			t.Fatal(err)
		}
		if _, err := v.PopWait(ctx, out); err != nil {
			t.Fatal(err)
		}
		if out[0].ID != req.ID {
			t.Fatalf("completion of request %d, want %d", out[0].ID, req.ID)
		}
	}
	for range 10 {
		read()
	}
	if n := testing.AllocsPerRun(500, read); n != 0 {
		t.Errorf("PushOne and PopWait through the rings allocate %.2f times a request", n)
	}
}
