//go:build linux

package soft

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// rdtscpCPU returns the low 12 bits of TSC_AUX, where Linux keeps the
// number of the CPU the thread runs on (as its vDSO getcpu reads it).
func rdtscpCPU() uint32

// cpuidExtEDX returns EDX of CPUID leaf 0x80000001 (0 if the leaf is
// missing).
func cpuidExtEDX() uint32

// hasRDTSCP is CPUID's RDTSCP bit, checked against getcpu once: a kernel
// that keeps something else in TSC_AUX leaves the CPU unknown.
var hasRDTSCP = func() bool {
	if cpuidExtEDX()&(1<<27) == 0 {
		return false
	}
	var cpu, node uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0); errno != 0 {
		return false
	}
	// A migration between the two reads is possible but rare; it only
	// costs the hint.
	return rdtscpCPU() == cpu
}()

// cpuNow returns the CPU this thread runs on, or -1 if unknown, in tens
// of nanoseconds (no system call).
func cpuNow() int32 {
	if !hasRDTSCP {
		return -1
	}
	return int32(rdtscpCPU())
}
