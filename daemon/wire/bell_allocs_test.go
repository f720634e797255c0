//go:build linux && !race

// The race detector allocates on its own account: allocation counts hold
// without it.

package wire

import (
	"context"
	"testing"
)

// TestBellAllocs: a Ring and a Sleep with the context of the previous
// Sleep allocate nothing (per sleep, context.AfterFunc's registration took
// 4 allocations and Ring's SyscallConn 1: most of what a request through
// krcored allocated).
func TestBellAllocs(t *testing.T) {
	b, err := NewBell()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ringSleep := func() {
		b.Ring()
		if err := b.Sleep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ringSleep()
	if n := testing.AllocsPerRun(1000, ringSleep); n != 0 {
		t.Errorf("Ring and Sleep allocate %.1f times", n)
	}
}
