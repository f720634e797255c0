package nonce_test

import (
	"testing"

	"github.com/krcore/krcore/internal/nonce"
)

// TestDistinct: draws do not repeat (a counter or a fixed seed would).
func TestDistinct(t *testing.T) {
	seen64, seen32 := map[uint64]bool{}, map[uint32]bool{}
	for range 1000 {
		a, b := nonce.Uint64(), nonce.Uint32()
		if seen64[a] {
			t.Fatalf("Uint64 repeated %#x within 1000 draws", a)
		}
		seen64[a], seen32[b] = true, true
	}
	if len(seen32) < 990 { // 1000 draws of 32 bits collide ~0.0001 times
		t.Fatalf("Uint32: %d distinct of 1000 draws", len(seen32))
	}
}
