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

// TestModifyMasks: the ibv_modify_qp mask built from verbs.CheckTransition
// for each step that connects a QP is the kernel's required set for it
// (ib_modify_qp_is_ok's req_param, with IBV_QP_STATE).
func TestModifyMasks(t *testing.T) {
	d := &device{portNum: 1, info: devInfo{port: verbs.PortAttr{MTU: 1024}, ethernet: true, maxRdAtomic: 16, maxInitAtom: 16}}
	dest := verbs.Endpoint{GID: verbs.GID{15: 1}, QPN: 9}
	init := verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessAll}
	rtr := verbs.QPAttr{State: verbs.StateRTR, Dest: dest}
	rts := verbs.QPAttr{State: verbs.StateRTS, RetryCount: 7, RNRRetry: 7}
	for _, c := range []struct {
		typ  verbs.QPType
		from verbs.QPState
		a    verbs.QPAttr
		want int
	}{
		{verbs.RC, verbs.StateReset, init, maskPKey | maskPort | maskAccess},
		{verbs.UC, verbs.StateReset, init, maskPKey | maskPort | maskAccess},
		{verbs.UD, verbs.StateReset, init, maskPKey | maskPort | maskQKey},
		{verbs.RC, verbs.StateInit, rtr, maskAV | maskPathMTU | maskDestQPN | maskRQPSN | maskMaxDestRd | maskMinRNRTimer},
		{verbs.UC, verbs.StateInit, rtr, maskAV | maskPathMTU | maskDestQPN | maskRQPSN},
		{verbs.UD, verbs.StateInit, rtr, 0},
		{verbs.RC, verbs.StateRTR, rts, maskTimeout | maskRetryCnt | maskRNRRetry | maskSQPSN | maskMaxRdAtomic},
		{verbs.UC, verbs.StateRTR, rts, maskSQPSN},
		{verbs.UD, verbs.StateRTR, rts, maskSQPSN},
		{verbs.RC, verbs.StateRTS, rts, 0},
		{verbs.RC, verbs.StateInit, verbs.QPAttr{State: verbs.StateErr}, 0},
	} {
		q := &qp{d: d, typ: c.typ}
		mask, err := verbs.CheckTransition(c.typ, c.from, c.a)
		if err != nil {
			t.Fatalf("%s %s -> %s: %v", c.typ, c.from, c.a.State, err)
		}
		m, err := q.attrFor(mask, c.a)
		if err != nil {
			t.Fatalf("%s %s -> %s: attrFor: %v", c.typ, c.from, c.a.State, err)
		}
		if m.mask != c.want|maskState {
			t.Errorf("%s %s -> %s: ibv mask %#x, want %#x", c.typ, c.from, c.a.State, m.mask, c.want|maskState)
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
