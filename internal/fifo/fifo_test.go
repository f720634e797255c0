package fifo

import (
	"slices"
	"testing"
)

// TestFifo: items come out in push order through drops, truncation and
// pushes that reuse the array, and a queue whose length stays bounded
// stops allocating once its array is grown.
func TestFIFO(t *testing.T) {
	var f FIFO[int]
	var want []int
	next := 0
	for round := 0; round < 100; round++ {
		for k := 0; k < 3; k++ {
			f.Push(next)
			want = append(want, next)
			next++
		}
		f.Drop(2)
		want = want[2:]
		if !slices.Equal(f.Items(), want) || f.Len() != len(want) {
			t.Fatalf("round %d: items %v, want %v", round, f.Items(), want)
		}
		if len(want) > 8 {
			f.Truncate(4)
			want = want[:4]
		}
	}
	f.Truncate(0)
	if f.Len() != 0 || f.head != 0 {
		t.Fatalf("truncate(0) left %d items, head %d", f.Len(), f.head)
	}
	for i := 0; i < 16; i++ {
		f.Push(i)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		f.Drop(1)
		f.Push(1)
	})
	if allocs != 0 {
		t.Fatalf("a bounded fifo allocates %.1f times a pop and push", allocs)
	}
}

// TestFIFOMovesAmortised: a queue kept at a bounded length by a pop and a
// push at a time moves its items down only once per as many pops (not on
// every push once its array is full), and its array stays bounded.
func TestFIFOMovesAmortised(t *testing.T) {
	const live = 16
	var f FIFO[int]
	for i := range live {
		f.Push(i)
	}
	moves, next := 0, live
	for range 10000 {
		f.Drop(1)
		headBefore := f.head
		f.Push(next)
		next++
		if f.head == 0 && headBefore > 0 {
			moves++
		}
		if got := f.Items(); got[0] != next-live || got[len(got)-1] != next-1 || len(got) != live {
			t.Fatalf("after push of %d: items %d..%d (%d), want %d..%d", next-1, got[0], got[len(got)-1], len(got), next-live, next-1)
		}
	}
	if moves > 10000/live+1 {
		t.Fatalf("the items moved down %d times in 10000 pushes: more than once per %d pops", moves, live)
	}
	if cap(f.s) > 4*live {
		t.Fatalf("array of %d for a queue of %d", cap(f.s), live)
	}
}
