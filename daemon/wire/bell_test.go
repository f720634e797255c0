//go:build linux

package wire

import (
	"context"
	"testing"
)

// TestBellSleepAfterCancel: a Sleep whose context ends (its AfterFunc sets
// a read deadline on a goroutine of its own, maybe after Sleep returned)
// must not cut the next Sleep short: the next one, rung, returns nil, not
// an i/o timeout (a lite call through krcored failed with "read eventfd:
// i/o timeout" that way).
func TestBellSleepAfterCancel(t *testing.T) {
	b, err := NewBell()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 2000 {
		ctx, cancel := context.WithCancel(context.Background())
		b.Ring()
		go cancel()
		b.Sleep(ctx) // ends by the ring, mostly, while the cancel runs
		go b.Ring()
		if err := b.Sleep(context.Background()); err != nil {
			t.Fatalf("#%d: a rung Sleep after a cancelled one: %v", i, err)
		}
	}
}

// TestBellSleepContextEnds: a Sleep returns its context's error when the
// context ends while it sleeps, before it sleeps, and after an earlier
// Sleep registered another context; a later Sleep with a live context is
// not cut short.
func TestBellSleepContextEnds(t *testing.T) {
	b, err := NewBell()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		if err := b.Sleep(ctx); err != context.Canceled {
			t.Fatalf("#%d: Sleep as its context ends: %v, want %v", i, err, context.Canceled)
		}
		if err := b.Sleep(ctx); err != context.Canceled {
			t.Fatalf("#%d: Sleep with an ended context: %v, want %v", i, err, context.Canceled)
		}
		go b.Ring()
		if err := b.Sleep(context.Background()); err != nil {
			t.Fatalf("#%d: a rung Sleep after a cancelled one: %v", i, err)
		}
	}
}
