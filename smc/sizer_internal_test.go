package smc

import "testing"

// TestSizerWatchesAMove: the keeper's shrink clock runs while a move is in
// progress. The reader ends a move (switchRing) without waking the
// keeper, so a grow whose move ended after the keeper's last wake-up left
// the buffer grown for good with the clock off (TestBufferShrinks under
// starvation: "after 10s idle the buffer is 262144 bytes").
func TestSizerWatchesAMove(t *testing.T) {
	c := &Conn{}
	c.moving = true
	var s sizer
	if s.due(c) {
		t.Fatal("a buffer due to shrink in the middle of a move")
	}
	if s.idle == nil {
		t.Fatal("no shrink clock while a move is in progress")
	}
}
