//go:build linux

package soft

import (
	"testing"
	"time"
)

// TestSpinLearnsMisses: a waiter whose waits in an exchange keep being
// answered later than a spin stops spinning for them but for one probe in
// shmProbeEvery, one answered within a spin turns spinning back on, and a
// wait with no exchange under way on its link never spins after a slow
// one.
func TestSpinLearnsMisses(t *testing.T) {
	l := &shmLink{node: &Node{start: time.Now().Add(-time.Second)}}
	var s spinLearner
	if s.pays(l) {
		t.Fatal("spins with no exchange under way")
	}
	// An exchange under way for the rest of the test, however the
	// scheduler delays it.
	l.active.Store(l.node.now() + int64(time.Hour))
	if !s.pays(l) {
		t.Fatal("does not spin in an exchange it knows nothing about")
	}
	for i := 0; i < shmSpinMisses; i++ {
		if !s.pays(l) {
			t.Fatalf("stopped spinning after %d misses", i)
		}
		s.note(3 * shmSpin)
	}
	spins := 0
	for i := 0; i < 4*shmProbeEvery; i++ {
		if s.pays(l) {
			spins++
		}
	}
	if spins != 4 {
		t.Fatalf("after %d misses, %d of %d waits spun, want 4 probes", shmSpinMisses, spins, 4*shmProbeEvery)
	}
	s.note(shmSpin / 2)
	if !s.pays(l) {
		t.Fatal("an answer within a spin did not turn spinning back on")
	}
}
