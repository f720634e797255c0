package lite_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// The hammered LMR: one range per writer, larger than the bounce buffer
// (so its Reads and Writes take two requests), then a range nobody writes.
const (
	writers = 4
	span    = 80 << 10
	static  = 16 << 10
)

// word is word i of writer w's range at version v.
func hammerWord(w, v, i int) uint64 { return uint64(w)<<56 | uint64(v)<<24 | uint64(i) }

func versioned(w, v int) []byte {
	b := make([]byte, span)
	for i := range span / 8 {
		binary.LittleEndian.PutUint64(b[8*i:], hammerWord(w, v, i))
	}
	return b
}

// TestMove: an LMR hammered by Writes and Reads from several goroutines of
// two mapper Nodes (node 1, embedded or through krcored, and node 3
// embedded) while its master moves it from node to node, through the
// mappers' own nodes too. Each writer owns a range and writes versioned
// patterns, then reads its range back: always exactly the version it
// wrote (no Write lost on an old copy). Readers check that every word of a
// read is the writer's, in place, of a version no older than the last
// Write that completed before the read began and no newer than the last
// that began (nothing read from a stale copy, nothing torn by a copy). The
// range nobody writes reads the same throughout. Operations that met a
// move were redone (Redone counts them).
func TestMove(t *testing.T) {
	others, mappers := testcluster.APIs(t, 3)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			// The hammer's own bound: under -race on a loaded machine its
			// few thousand checked operations take seconds.
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			master := open(t, others[0])
			users := []*lite.Node{open(t, api), open(t, others[1])} // nodes 1 and 3
			l, err := master.Malloc(ctx, "hot", writers*span+static, lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			for w := range writers {
				copy(l.Bytes()[w*span:], versioned(w, 0))
			}
			still := l.Bytes()[writers*span:]
			for i := range still {
				still[i] = byte(i * 13)
			}
			want := slices.Clone(still)
			var handles []lite.Handle
			for _, u := range users {
				h, err := u.Map(ctx, 2, "hot", lite.Read|lite.Write)
				if err != nil {
					t.Fatal(err)
				}
				handles = append(handles, h)
			}

			var started, done [writers]atomic.Int64
			stop := make(chan struct{})
			tick := make(chan struct{})
			progress := func() {
				select {
				case tick <- struct{}{}:
				default:
				}
			}
			var wg sync.WaitGroup
			failed := make(chan struct{})
			var once sync.Once
			fail := func(format string, args ...any) {
				t.Errorf(format, args...)
				once.Do(func() { close(failed) })
			}
			running := func() bool {
				select {
				case <-stop:
					return false
				default:
					return !t.Failed()
				}
			}
			for w := range writers {
				u, h := users[w%2], handles[w%2]
				wg.Add(1)
				go func() {
					defer wg.Done()
					got := make([]byte, span)
					for running() {
						v := int(started[w].Add(1))
						p := versioned(w, v)
						if err := u.Write(ctx, h, w*span, p); err != nil {
							fail("writer %d, version %d: %v", w, v, err)
							return
						}
						done[w].Store(int64(v))
						if err := u.Read(ctx, h, w*span, got); err != nil || !slices.Equal(got, p) {
							fail("writer %d reads back version %d: %v, equal %v", w, v, err, slices.Equal(got, p))
							return
						}
						progress()
					}
				}()
			}
			for r := range 4 {
				u, h := users[r%2], handles[r%2]
				wg.Add(1)
				go func() {
					defer wg.Done()
					got := make([]byte, span)
					fixed := make([]byte, static)
					for running() {
						w := rand.IntN(writers)
						lo := int(done[w].Load())
						if err := u.Read(ctx, h, w*span, got); err != nil {
							fail("reader %d, range %d: %v", r, w, err)
							return
						}
						hi := int(started[w].Load())
						for i := range span / 8 {
							x := binary.LittleEndian.Uint64(got[8*i:])
							v := int(x >> 24 & (1<<32 - 1))
							if x>>56 != uint64(w) || x&(1<<24-1) != uint64(i) || v < lo || v > hi {
								fail("reader %d, range %d, word %d: %#x, want writer %d's version in [%d, %d]", r, w, i, x, w, lo, hi)
								return
							}
						}
						if err := u.Read(ctx, h, writers*span, fixed); err != nil || !slices.Equal(fixed, want) {
							fail("reader %d, the range nobody writes: %v, equal %v", r, err, slices.Equal(fixed, want))
							return
						}
						progress()
					}
				}()
			}
			for _, to := range []krcore.NodeID{3, 1, 2, 3, 1, 2} {
				for range 8 { // some operations on each copy
					select {
					case <-tick:
					case <-failed:
					case <-ctx.Done():
						t.Fatal("no progress")
					}
				}
				if err := l.Move(ctx, to); err != nil {
					t.Errorf("Move to node %d: %v", to, err)
					break
				}
				if got := l.Nodes(); !slices.Equal(got, []krcore.NodeID{to}) {
					t.Errorf("after Move to node %d the LMR is on %v", to, got)
				}
			}
			for range 8 {
				select {
				case <-tick:
				case <-failed:
				}
			}
			close(stop)
			wg.Wait()
			if t.Failed() {
				return
			}
			if r := lite.Redone(users[0]) + lite.Redone(users[1]); r == 0 {
				t.Fatal("no operation met a move: the test did not test")
			} else {
				t.Logf("%d operations redone on a new copy", r)
			}
			if !slices.Equal(l.Bytes()[writers*span:], want) {
				t.Fatal("the range nobody writes changed")
			}
			for w := range writers {
				if v := int(done[w].Load()); !slices.Equal(l.Bytes()[w*span:(w+1)*span], versioned(w, v)) {
					t.Fatalf("writer %d's range is not its last version %d", w, v)
				}
			}
		})
	}
}

// TestMoveStriped: a striped LMR moves whole to one node, a registered one
// leaves the caller's memory behind, and a move to a node that is not
// there fails and leaves the LMR where it was, still usable.
func TestMoveStriped(t *testing.T) {
	others, mappers := testcluster.APIs(t, 3)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			mapper := open(t, api)
			open(t, others[1])           // node 3, a holder
			master := open(t, others[0]) // closes first, freeing what the others hold
			const size = 5*4096 + 100
			l, err := master.MallocOn(ctx, "s", size, lite.Read|lite.Write, lite.Placement{Nodes: []krcore.NodeID{2, 3}, Stripe: 4096})
			if err != nil {
				t.Fatal(err)
			}
			h, err := mapper.Map(ctx, 2, "s", lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i / 7)
			}
			if err := mapper.Write(ctx, h, 0, want); err != nil {
				t.Fatal(err)
			}
			if err := l.Move(ctx, 1); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := mapper.Read(ctx, h, 0, got); err != nil || !slices.Equal(got, want) || !slices.Equal(l.Nodes(), []krcore.NodeID{1}) {
				t.Fatalf("Read after Move: %v, equal %v, nodes %v", err, slices.Equal(got, want), l.Nodes())
			}
			start := time.Now()
			if err := l.Move(ctx, 9); err == nil {
				t.Fatal("Move to a node that is not there")
			} else {
				t.Logf("Move to node 9 after %v: %v", time.Since(start), err)
			}
			if err := mapper.Read(ctx, h, 0, got); err != nil || !slices.Equal(got, want) || !slices.Equal(l.Nodes(), []krcore.NodeID{1}) {
				t.Fatalf("Read after a failed Move: %v, equal %v, nodes %v", err, slices.Equal(got, want), l.Nodes())
			}

			mr, err := others[0].RegMR(4096, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			copy(mr.Bytes(), "caller's")
			r, err := master.Register(ctx, "r", mr, lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			hr, err := mapper.Map(ctx, 2, "r", lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Move(ctx, 3); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Write(ctx, hr, 0, []byte("moved!!!")); err != nil {
				t.Fatal(err)
			}
			if string(mr.Bytes()[:8]) != "caller's" || r.Bytes() != nil {
				t.Fatalf("after Move the caller's memory has %q, the LMR's Bytes %v", mr.Bytes()[:8], r.Bytes() != nil)
			}
			if err := mapper.Read(ctx, hr, 0, got[:8]); err != nil || string(got[:8]) != "moved!!!" {
				t.Fatalf("Read of the moved LMR: %q, %v", got[:8], err)
			}
			if err := r.Free(); err != nil {
				t.Fatal(err)
			}
			if mr.Bytes() == nil {
				t.Fatal("Free of a moved registered LMR deregistered the caller's memory")
			}
		})
	}
}
