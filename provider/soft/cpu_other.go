//go:build linux && !amd64

package soft

// cpuNow returns the CPU this thread runs on, or -1 if unknown: without a
// system-call-free way to read it, the shm link's spinners behave as if
// the peer's CPU were unknown.
func cpuNow() int32 { return -1 }
