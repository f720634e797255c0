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
