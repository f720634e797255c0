package smc

import "testing"

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
