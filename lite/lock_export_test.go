package lite

import (
	"sync/atomic"
	"unsafe"
)

// Tickets is how many tickets of the lock were taken, read at its master
// (l from NewLock), so that a test can order its waiters.
func Tickets(l *Lock) uint32 {
	b := l.lmr.Bytes()
	return nextOf(atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[offState]))))
}
