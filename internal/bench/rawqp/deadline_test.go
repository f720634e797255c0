package rawqp

import (
	"context"
	"testing"
	"time"
)

// TestDeadlineReuse: Get hands out the same context while its deadline is
// at least half the timeout away, and a fresh one after.
func TestDeadlineReuse(t *testing.T) {
	d := NewDeadline(context.Background(), 400*time.Millisecond)
	defer d.Close()
	first := d.Get()
	if d.Get() != first {
		t.Error("a second Get right away made a new context")
	}
	time.Sleep(250 * time.Millisecond) // past timeout/2: the next Get must renew
	if d.Get() == first {
		t.Error("Get past half the timeout kept the old context")
	}
	if first.Err() == nil {
		t.Error("the replaced context was not cancelled")
	}
}
