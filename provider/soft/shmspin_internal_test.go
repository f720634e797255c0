//go:build linux

package soft

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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

// TestPeerCPU: a spinner publishes the CPU it runs on and tells whether
// the peer's spinner last ran on it, on another CPU, or is unknown
// (asleep). The thread is pinned to one CPU so that it cannot move
// between the test's reads and the spinner's.
func TestPeerCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpu, node uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0); errno != 0 {
		t.Skip("getcpu:", errno)
	}
	var set, old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Skip("sched_getaffinity:", err)
	}
	set.Set(int(cpu))
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Skip("sched_setaffinity:", err)
	}
	defer unix.SchedSetaffinity(0, &old)
	me := cpuNow()
	if me < 0 {
		t.Skip("no way to read the CPU here: spinners treat the peer as unknown")
	}
	if uint32(me) != cpu {
		t.Fatalf("cpuNow %d, getcpu %d", me, cpu)
	}
	l := &shmLink{seg: &shmSeg{mem: make([]byte, shmCtlSize)}, side: 1}
	peer := l.seg.spinCPU(0)
	for _, c := range []struct {
		word uint32
		want int
	}{{0, peerUnknown}, {uint32(me) + 1, peerHere}, {uint32(me) + 2, peerElsewhere}} {
		peer.Store(c.word)
		if got := l.peerCPU(); got != c.want {
			t.Errorf("peer's word %d on CPU %d: %d, want %d", c.word, me, got, c.want)
		}
		if w := l.seg.spinCPU(1).Load(); w != uint32(me)+1 {
			t.Errorf("own word %d, want %d", w, me+1)
		}
	}
}
