package kernellink

import "testing"

// TestCursor: byte counts survive the trip through a cursor, across ring
// wraps and the 16-bit wrap counter's own wrap, as long as they move
// forward from the last count known by less than a cycle.
func TestCursor(t *testing.T) {
	const size = 64 << 10
	period := uint64(size) << 16
	for _, tc := range []struct{ near, n uint64 }{
		{0, 0}, {0, 100}, {100, size}, {size - 1, size + 1},
		{period - 10, period + 5}, {3*period + 7, 3*period + size*9 + 1},
	} {
		if got := fromCursor(cursorOf(tc.n, size), size, tc.near); got != tc.n {
			t.Errorf("fromCursor(cursorOf(%d), near %d) = %d", tc.n, tc.near, got)
		}
	}
}
