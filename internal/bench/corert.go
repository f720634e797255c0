//go:build linux

package bench

import (
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// crossCoreRTT measures what one cache line costs to go to another core
// and back: two threads, pinned to the first two CPUs this process may
// use, pass a counter back and forth (rounds round trips per block; the
// median of the blocks that finished). The daemon's hop is a few such
// transfers each way, so its cost follows this figure, which a virtual
// machine's host may change from one second to the next (80-130 ns and
// 320-390 ns were both seen on the same 2-vCPU machine). ok is false with
// fewer than two CPUs, when the threads cannot be pinned, or when no block
// finished. No block starts after coreRTTBudget, so that a loaded machine
// bounds the run rather than failing it. Call it in a process of its own:
// threads the Go runtime clones from a pinned one inherit its pinning.
func crossCoreRTT(rounds, blocks int) (rtt time.Duration, ok bool) {
	var allowed unix.CPUSet
	if unix.SchedGetaffinity(0, &allowed) != nil {
		return 0, false
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 2; c++ {
		if allowed.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return 0, false
	}
	res := make([]time.Duration, 0, blocks)
	start := time.Now()
	for range blocks {
		if time.Since(start) > coreRTTBudget {
			break
		}
		d, pinned, ok := pingPong(cpus[0], cpus[1], rounds)
		if !pinned {
			return 0, false
		}
		if ok {
			res = append(res, d)
		}
	}
	if len(res) == 0 {
		return 0, false
	}
	slices.Sort(res)
	return res[len(res)/2], true
}

// A block of crossCoreRTT gives up after coreRTTStall without a round
// trip (a CPU taken away meanwhile: on a loaded machine the two threads
// run at once only now and then, so a block may take far longer than its
// rounds, but it progresses) or after coreRTTBlock in all; no block starts
// after coreRTTBudget. The caller (dBench.machine) waits 10 s for the
// whole process.
const (
	coreRTTStall  = time.Second
	coreRTTBlock  = 3 * time.Second
	coreRTTBudget = 4 * time.Second
)

// pingPong is one block of crossCoreRTT: the mean round trip, whether the
// threads were pinned, and whether the block finished (see coreRTTStall).
func pingPong(c0, c1, rounds int) (rtt time.Duration, pinned, ok bool) {
	var ping, pong atomic.Uint64
	var failed atomic.Bool
	ready, done := make(chan bool, 1), make(chan time.Duration, 1)
	defer watchProgress(&ping, &failed)()
	// Both goroutines are this call's: it returns once they ended (the
	// ponger at its last round or at failed, which the pinger or the
	// watch sets), so no spinning thread outlives the block.
	ponged := make(chan struct{})
	defer func() { <-ponged }()
	go func() { // its thread ends with it, pinned and locked
		defer close(ponged)
		if !pinThread(c1) {
			ready <- false
			return
		}
		ready <- true
		for i := uint64(1); i <= uint64(rounds); i++ {
			for ping.Load() != i {
				if failed.Load() {
					return
				}
			}
			pong.Store(i)
		}
	}()
	go func() {
		if !<-ready || !pinThread(c0) {
			failed.Store(true)
			done <- -1
			return
		}
		start := time.Now()
		for i := uint64(1); i <= uint64(rounds); i++ {
			ping.Store(i)
			for pong.Load() != i {
				if failed.Load() {
					done <- 0
					return
				}
			}
		}
		done <- time.Since(start) / time.Duration(rounds)
	}()
	d := <-done
	return d, d >= 0, d >= 0 && !failed.Load()
}

// watchProgress sets failed once ping stands still for coreRTTStall or
// coreRTTBlock has passed; the function it returns stops the watch.
func watchProgress(ping *atomic.Uint64, failed *atomic.Bool) (stop func()) {
	quit := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(coreRTTStall)
		defer t.Stop()
		end := time.NewTimer(coreRTTBlock)
		defer end.Stop()
		last := ping.Load()
		for {
			select {
			case <-quit:
				return
			case <-end.C:
				failed.Store(true)
				return
			case <-t.C:
			}
			if now := ping.Load(); now != last {
				last = now
				continue
			}
			failed.Store(true)
			return
		}
	}()
	return func() { close(quit); <-exited }
}

// pinThread locks the goroutine to its thread and the thread to cpu; the
// thread exits with the goroutine, so its affinity never leaks.
func pinThread(cpu int) bool {
	runtime.LockOSThread()
	var s unix.CPUSet
	s.Set(cpu)
	return unix.SchedSetaffinity(0, &s) == nil
}
