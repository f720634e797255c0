package smc

import (
	"testing"
	"time"
)

// TestUpdateAfterMove: a receiver that moved to a new buffer, read
// everything and last confirmed a position before the move returns its
// cursor: the writer fills the new buffer (its window counts from the
// move) and waits. (The window was counted from the last confirmed
// position, which overflowed the new buffer's size: no update, and the
// writer, whose blocked flag the receiver had answered with an earlier
// cursor, waited for ever.)
func TestUpdateAfterMove(t *testing.T) {
	c := &Conn{}
	c.ring, c.base = make([]byte, 64<<10), 18112
	c.prod, c.cons, c.confirmed = 18112+64<<10, 18112+64<<10, 9152
	if !c.wantUpdate() {
		t.Fatal("a receiver holding the writer's whole window returns no cursor")
	}
	if over := c.overrun(); over != 0 {
		t.Fatalf("overrun %d, want 0", over)
	}
	// Moved, the new ring half read: its window counts from moveAt.
	c = &Conn{}
	c.ring, c.nextRing, c.moving, c.moved, c.moveAt = make([]byte, 16<<10), make([]byte, 64<<10), true, true, 10000
	c.prod, c.cons, c.confirmed = 10000+64<<10, 10000+32<<10, 5000
	if !c.wantUpdate() || c.overrun() != 0 {
		t.Fatalf("moved: update %v, overrun %d; want true, 0", c.wantUpdate(), c.overrun())
	}
	c.cons = 10000
	c.prod++
	if c.overrun() != 1 {
		t.Fatalf("one byte more than the new ring holds: overrun %d, want 1", c.overrun())
	}
}

// TestGrowPastLagBuffer: a receive buffer grows four times for a writer
// blocked twice, but past lagBuffer only for a writer that said twice
// that its waits for window were long (flagWindowLag): in one process a
// 4 MiB buffer streamed slower than a 1 MiB one, through krcored faster.
func TestGrowPastLagBuffer(t *testing.T) {
	c := &Conn{node: &Node{maxSize: 4 << 20}}
	c.peerNode = 7
	c.ring = make([]byte, 256<<10)
	c.blocks = 2
	if got := c.wantGrow(); got != 1<<20 {
		t.Fatalf("256 KiB, blocked twice: grow to %d, want 1 MiB", got)
	}
	c.ring = make([]byte, 1<<20)
	if got := c.wantGrow(); got != 0 {
		t.Fatalf("1 MiB, blocked twice without lagging: grow to %d, want none", got)
	}
	for range 2 {
		if !c.onCDC(7, cdcMsg{prodFlags: flagWriteBlocked | flagCursorRequest | flagWindowLag}) {
			t.Fatal("the peer's CDC was refused")
		}
	}
	if got := c.wantGrow(); got != 4<<20 {
		t.Fatalf("1 MiB, blocked and lagging twice: grow to %d, want 4 MiB", got)
	}
}

// TestPace: a writer's wait for window of lagWait or more makes it lag,
// a short one not; no wait changes nothing.
func TestPace(t *testing.T) {
	c := &Conn{}
	from := time.Now().Add(-2 * lagWait)
	c.pace(&from)
	if !c.lagging || !from.IsZero() {
		t.Fatalf("after a wait of %v: lagging %v, wait start %v; want true, cleared", 2*lagWait, c.lagging, from)
	}
	var none time.Time
	c.pace(&none)
	if !c.lagging {
		t.Fatal("no wait cleared lagging")
	}
	from = time.Now()
	c.pace(&from)
	if c.lagging {
		t.Fatal("a wait of microseconds lags")
	}
}
