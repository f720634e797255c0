//go:build linux && cgo && rdma

package ibverbs

import (
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// These tests need libibverbs to link but no device.

func TestTimeoutCode(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{0, defaultTimeoutCode}, {time.Nanosecond, 1}, {8192 * time.Nanosecond, 1}, {8193 * time.Nanosecond, 2}, {67 * time.Millisecond, 14}, {time.Hour, 30}, {10 * time.Hour, 31}} {
		if got := timeoutCode(c.d); got != c.want {
			t.Errorf("timeoutCode(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestRNRCode(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{0, defaultRNRCode}, {10 * time.Microsecond, 1}, {time.Millisecond, 14}, {1280 * time.Microsecond, 14}, {491 * time.Millisecond, 31}, {time.Second, 0}} {
		if got := rnrCode(c.d); got != c.want {
			t.Errorf("rnrCode(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestMTU(t *testing.T) {
	for m := 1; m <= 5; m++ {
		if got := mtuEnum(mtuBytes(m)); got != m {
			t.Errorf("mtuEnum(mtuBytes(%d)) = %d", m, got)
		}
	}
	if mtuEnum(1500) != 3 || mtuEnum(100) != 1 || mtuBytes(0) != 0 {
		t.Error("mtuEnum(1500) should be 1024's code, mtuEnum(100) 256's, mtuBytes(0) 0")
	}
}

func TestLegalTransitions(t *testing.T) {
	ok := map[[2]verbs.QPState]bool{
		{verbs.StateReset, verbs.StateInit}: true, {verbs.StateInit, verbs.StateRTR}: true,
		{verbs.StateRTR, verbs.StateRTS}: true, {verbs.StateRTS, verbs.StateRTS}: true,
		{verbs.StateErr, verbs.StateReset}: true, {verbs.StateReset, verbs.StateErr}: true,
	}
	for pair, want := range ok {
		if legal(pair[0], pair[1]) != want {
			t.Errorf("legal(%s, %s) = %v", pair[0], pair[1], !want)
		}
	}
	for _, bad := range [][2]verbs.QPState{{verbs.StateReset, verbs.StateRTR}, {verbs.StateInit, verbs.StateRTS}, {verbs.StateErr, verbs.StateInit}, {verbs.StateRTS, verbs.StateRTR}} {
		if legal(bad[0], bad[1]) {
			t.Errorf("legal(%s, %s) = true", bad[0], bad[1])
		}
	}
}

// TestSlotTable: slots come back once, and a key from before a reset is
// not mistaken for the slot's current use.
func TestSlotTable(t *testing.T) {
	s := newSlotTable(2)
	k1, k2 := s.alloc(100), s.alloc(200)
	if s.avail() != 0 {
		t.Fatalf("avail %d after filling", s.avail())
	}
	if id, ok := s.release(k2); !ok || id != 200 {
		t.Fatalf("release k2: %d %v", id, ok)
	}
	if _, ok := s.release(k2); ok {
		t.Fatal("released k2 twice")
	}
	s.reset()
	k3 := s.alloc(300)
	if _, ok := s.release(k1); ok && uint32(k1) == uint32(k3) {
		t.Fatal("stale key of a reset slot released its new use")
	}
	if id, ok := s.release(k3); !ok || id != 300 {
		t.Fatalf("release k3: %d %v", id, ok)
	}
}

func TestIPv4Mapped(t *testing.T) {
	g, _ := verbs.ParseGID("::ffff:10.0.0.1")
	l, _ := verbs.ParseGID("fe80::7cef:63ff:fea9:d50c")
	if !isIPv4Mapped(g) || isIPv4Mapped(l) {
		t.Error("isIPv4Mapped wrong")
	}
}
