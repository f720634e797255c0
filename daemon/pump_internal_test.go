package daemon

import (
	"testing"

	"github.com/krcore/krcore/daemon/wire"
)

// TestJoinArmedPump: a VQ that joins a pump armed to sleep is armed too, so
// its client's first publish rings the doorbell; one that joins an awake
// pump is not (its client would make a system call per publish for
// nothing). Without it, a Connect right after Queue could wait on a pump
// that slept through the VQ's arrival (krbench daemon's connector process
// did, for its whole timeout).
func TestJoinArmedPump(t *testing.T) {
	newVQ := func() *vq {
		mem := make([]byte, wire.RingSize(64))
		r, err := wire.NewRing(mem, 64)
		if err != nil {
			t.Fatal(err)
		}
		r.Ctr(wire.SQTail).Store(7)
		return &vq{ring: r}
	}
	p := &pump{}
	awake := newVQ()
	p.join(awake)
	if got := awake.ring.Ctr(wire.DaemonSleeps).Load(); got != 0 {
		t.Fatalf("VQ joined an awake pump: DaemonSleeps %d, want 0", got)
	}
	p.arm()
	late := newVQ()
	p.join(late)
	if got := late.ring.Ctr(wire.DaemonSleeps).Load(); got != 1 {
		t.Fatalf("VQ joined an armed pump: DaemonSleeps %d, want 1", got)
	}
	if got := late.armedTail.Load(); got != 7 {
		t.Errorf("armedTail %d, want the SQ tail 7", got)
	}
	p.disarm()
	for i, v := range []*vq{awake, late} {
		if got := v.ring.Ctr(wire.DaemonSleeps).Load(); got != 0 {
			t.Errorf("VQ %d after disarm: DaemonSleeps %d", i, got)
		}
	}
}
