package smc

import (
	"testing"
	"time"

	"github.com/krcore/krcore/internal/poprole"
)

// TestSignalUncountsWaiter: a reader waiting for its signal while the
// serving goroutine pops counts as needing it to pop until it is
// signalled, not until it runs: the serving goroutine then leaves the role
// free for it after the batch that signalled it, so a ping-pong's reader
// pops its next message itself. Each wait is uncounted exactly once,
// whoever wakes it: its signal, its deadline, or both.
func TestSignalUncountsWaiter(t *testing.T) {
	n := &Node{}
	n.pop.Role = poprole.New() // the serving goroutine holds it: waiters need it
	c := &Conn{node: n, done: make(chan struct{})}
	c.rxSig, c.txSig = make(chan struct{}, 1), make(chan struct{}, 1)
	waitMarked := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !c.needRx.Load(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the reader never waited for its signal", what)
			}
		}
		if got := n.pop.Needing(); got != 1 {
			t.Fatalf("%s: %d goroutines need the serving goroutine, want the waiting reader alone", what, got)
		}
	}
	// Signalled.
	returned := make(chan struct{})
	go func() { c.await(c.rxSig, nil); close(returned) }()
	waitMarked("signalled")
	c.signalSig(c.rxSig)
	if c.needRx.Load() {
		t.Fatal("the signal left the reader marked as needing the serving goroutine")
	}
	<-returned
	if got := n.pop.Needing(); got != 0 {
		t.Fatalf("after a signalled wait: need %d, want 0", got)
	}
	// A signal for the writer leaves the reader counted.
	dl := make(chan struct{})
	returned = make(chan struct{})
	go func() { c.await(c.rxSig, dl); close(returned) }()
	waitMarked("deadline")
	c.signalSig(c.txSig)
	if got := n.pop.Needing(); got != 1 {
		t.Fatalf("the writer's signal changed the reader's count: need %d, want 1", got)
	}
	// The deadline ends the wait; a signal racing it uncounts it once.
	close(dl)
	c.signalSig(c.rxSig)
	<-returned
	if got := n.pop.Needing(); got != 0 {
		t.Fatalf("after a wait ended by its deadline and a signal: need %d, want 0", got)
	}
}
