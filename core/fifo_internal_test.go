package core

import (
	"slices"
	"testing"
)

// TestFifo: items come out in push order through drops, truncation and
// pushes that reuse the array, and a queue whose length stays bounded
// stops allocating once its array is grown.
func TestFifo(t *testing.T) {
	var f fifo[int]
	var want []int
	next := 0
	for round := 0; round < 100; round++ {
		for k := 0; k < 3; k++ {
			f.push(next)
			want = append(want, next)
			next++
		}
		f.drop(2)
		want = want[2:]
		if !slices.Equal(f.items(), want) || f.len() != len(want) {
			t.Fatalf("round %d: items %v, want %v", round, f.items(), want)
		}
		if len(want) > 8 {
			f.truncate(4)
			want = want[:4]
		}
	}
	f.truncate(0)
	if f.len() != 0 || f.head != 0 {
		t.Fatalf("truncate(0) left %d items, head %d", f.len(), f.head)
	}
	for i := 0; i < 16; i++ {
		f.push(i)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		f.drop(1)
		f.push(1)
	})
	if allocs != 0 {
		t.Fatalf("a bounded fifo allocates %.1f times a pop and push", allocs)
	}
}
