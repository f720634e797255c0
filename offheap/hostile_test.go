package offheap_test

import (
	"errors"
	"math"
	"testing"

	"github.com/krcore/krcore/offheap"
)

// TestHostileSlice names memory by every address a caller can forge:
// Slice refuses each outside a live block with ErrNotOffHeap, never
// panics, and returns exactly the bytes asked for inside one.
func TestHostileSlice(t *testing.T) {
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	base := offheap.Addr(blk.Bytes())
	bad := map[string]struct {
		addr uint64
		n    int
	}{
		"address 0":       {0, 8},
		"max address":     {math.MaxUint64, 1},
		"far above":       {math.MaxUint64 - 15, 8},
		"2^63 above base": {base + 1<<63, 8},
		"past the end":    {base + 4090, 8},
		"negative length": {base, -1},
		"length MaxInt":   {base + 8, math.MaxInt},
		"just past":       {base + 4096, 1},
		"below the block": {base - 1, 2},
	}
	for name, c := range bad {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			if b, err := offheap.Slice(c.addr, c.n); !errors.Is(err, offheap.ErrNotOffHeap) {
				t.Errorf("Slice(%#x, %d): %d bytes, %v, want ErrNotOffHeap", c.addr, c.n, len(b), err)
			}
		})
	}
	if b, err := offheap.Slice(base+100, 8); err != nil || len(b) != 8 || &b[0] != &blk.Bytes()[100] {
		t.Errorf("Slice inside the block: %d bytes, %v", len(b), err)
	}
}

// TestHostileSizes hands every allocation and mapping a bad size: each
// fails with ErrBadSize, never maps anything.
func TestHostileSizes(t *testing.T) {
	small, err := offheap.AllocShared("small", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	for _, size := range []int{0, -1, math.MinInt, math.MaxInt, math.MaxInt - 1} {
		calls := map[string]func() (*offheap.Block, error){
			"Alloc":       func() (*offheap.Block, error) { return offheap.Alloc(size) },
			"AllocShared": func() (*offheap.Block, error) { return offheap.AllocShared("x", size) },
			"Open":        func() (*offheap.Block, error) { return offheap.Open(small.FD(), size) },
		}
		for name, f := range calls {
			if b, err := f(); !errors.Is(err, offheap.ErrBadSize) {
				if b != nil {
					b.Close()
				}
				t.Errorf("%s(%d): %v, want ErrBadSize", name, size, err)
			}
		}
	}
	if b, err := offheap.Open(small.FD(), 1<<20); !errors.Is(err, offheap.ErrBadSize) {
		if b != nil {
			b.Close()
		}
		t.Errorf("Open of more than the file holds: %v, want ErrBadSize", err)
	}
}
