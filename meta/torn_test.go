package meta

import (
	"testing"
	"time"
)

// tearSlot finds node's slot in srv's table and overwrites its first half
// with the first half of rec encoded under version: the slot as a READ
// sees it while the server's writer, mid-copy, is off the CPU. It returns
// the second half's writer: the writer resuming.
func tearSlot(t *testing.T, srv *Server, node uint64, rec Record, version uint64) (finish func()) {
	t.Helper()
	slot := tableSlotOf(t, srv, node)
	var b [SlotSize]byte
	encodeSlot(b[:], version, rec)
	copy(slot[:SlotSize/2], b[:SlotSize/2])
	if slotIntact(slot) {
		t.Fatal("half a new version left the slot intact")
	}
	return func() { copy(slot[SlotSize/2:], b[SlotSize/2:]) }
}

// TestTornWhileWriterStalls: a slot stays torn for as long as the server's
// writer is off the CPU in the middle of rewriting it, which on a loaded
// machine lasts milliseconds, far longer than a burst of READs. A Fetch
// keeps reading (pausing between READs, so the writer can run) until the
// slot is whole again and returns the new record (TestTornForever: one
// that outlasts TornWait fails).
func TestTornWhileWriterStalls(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, ClientConfig{})
	rec := recordOf(nodes[1], 7)
	if err := c.Register(ctx, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	moved := rec
	moved.DCTNum++
	finish := tearSlot(t, srv, 7, moved, 1<<40)
	type result struct {
		rec Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.Fetch(ctx, 7)
		done <- result{r, err}
	}()
	// The writer stays stalled past 16 READs back to back, the budget
	// that once failed such a lookup, and past a few milliseconds.
	eventually(t, 5*time.Second, "torn READs", func() bool { return c.Stats().TornReads > 16 })
	time.Sleep(5 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("Fetch of a torn slot returned %+v, %v while the writer was stalled", r.rec, r.err)
	default:
	}
	finish()
	r := <-done
	if r.err != nil || withVersion(r.rec, 0) != moved || r.rec.Version != 1<<40 {
		t.Fatalf("Fetch once the writer resumed: %+v, %v; want %+v at version %d", r.rec, r.err, moved, uint64(1<<40))
	}
}
