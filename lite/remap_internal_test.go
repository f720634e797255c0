package lite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/verbs"
)

// TestRemapRacingUnmap: through krcored, a remap (the LMR moved) whose
// handle is unmapped while it looks up the new copy forgets the regions
// it looked up, and one that ends after the Node closed forgets them too:
// the daemon holds none of them after (each stayed there until the mapper
// detached). The Unmap's local half (take) and the Close flag are set
// between the Move and the remap, where a concurrent Unmap or Close lands
// in the race.
func TestRemapRacingUnmap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	others, mappers := testcluster.APIs(t, 3)
	api := mappers["daemon"]
	master, err := Open(ctx, others[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	far, err := Open(ctx, others[1], Options{}) // node 3, where the LMR moves
	if err != nil {
		t.Fatal(err)
	}
	defer far.Close()
	mapper, err := Open(ctx, api, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mapper.Close()
	l, err := master.Malloc(ctx, "moving", 4096, Read|Write)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	h, err := mapper.Map(ctx, 2, "moving", Read) // the first: the Node's own lookups done
	if err == nil {
		err = mapper.Read(ctx, h, 0, buf)
	}
	if err == nil {
		err = mapper.Unmap(ctx, h)
	}
	if err != nil {
		t.Fatal(err)
	}
	held := testcluster.DaemonRegions(t, api)
	for i, to := range []krcore.NodeID{3, 2} {
		h, err := mapper.Map(ctx, 2, "moving", Read)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Move(ctx, to); err != nil {
			t.Fatal(err)
		}
		m, err := mapper.lookup(h)
		if err != nil {
			t.Fatal(err)
		}
		want := ErrBadHandle
		if i == 0 {
			if _, err := mapper.take(h); err != nil {
				t.Fatal(err)
			}
		} else {
			want = krcore.ErrClosed
			mapper.mu.Lock()
			mapper.closed = true
			mapper.mu.Unlock()
		}
		_, err = mapper.remap(ctx, h, m, verbs.RemAccessErr)
		if !errors.Is(err, want) || !errors.Is(err, verbs.RemAccessErr) {
			t.Errorf("remap %d: %v, want %v and %v", i, err, want, verbs.RemAccessErr)
		}
		if i == 0 {
			if err := mapper.withdraw(ctx, m); err != nil {
				t.Fatal(err)
			}
			if n := testcluster.DaemonRegions(t, api); n != held {
				t.Errorf("krcored holds %d regions of the mapper after a remap raced an Unmap, %d before", n, held)
			}
		}
	}
	mapper.mu.Lock()
	mapper.closed = false // Close runs whole
	mapper.mu.Unlock()
	mapper.Close()
	if n := testcluster.DaemonRegions(t, api); n != held {
		t.Errorf("krcored holds %d regions of the mapper after a remap raced its Close, %d before", n, held)
	}
}
