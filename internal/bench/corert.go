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
// median of blocks). The daemon's hop is a few such transfers each way, so
// its cost follows this figure, which a virtual machine's host may change
// from one second to the next (80-130 ns and 320-390 ns were both seen on
// the same 2-vCPU machine). ok is false with fewer than two CPUs or when
// the threads cannot be pinned. Call it in a process of its own: threads
// the Go runtime clones from a pinned one inherit its pinning.
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
	for range blocks {
		d, ok := pingPong(cpus[0], cpus[1], rounds)
		if !ok {
			return 0, false
		}
		res = append(res, d)
	}
	slices.Sort(res)
	return res[len(res)/2], true
}

// pingPong is one block of crossCoreRTT. The threads give up after a
// second without progress (a CPU taken away meanwhile) rather than hang.
func pingPong(c0, c1, rounds int) (time.Duration, bool) {
	var ping, pong atomic.Uint64
	var failed atomic.Bool
	ready, done := make(chan bool, 1), make(chan time.Duration, 1)
	deadline := time.AfterFunc(time.Second+time.Duration(rounds)*time.Microsecond, func() { failed.Store(true) })
	defer deadline.Stop()
	go func() { // its thread ends with it, pinned and locked
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
			done <- 0
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
	return d, !failed.Load()
}

// pinThread locks the goroutine to its thread and the thread to cpu; the
// thread exits with the goroutine, so its affinity never leaks.
func pinThread(cpu int) bool {
	runtime.LockOSThread()
	var s unix.CPUSet
	s.Set(cpu)
	return unix.SchedSetaffinity(0, &s) == nil
}
