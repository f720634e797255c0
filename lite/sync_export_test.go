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

// BarrierWaiting is how many participants wait at the barrier called
// name mastered by n.
func BarrierWaiting(n *Node, name string) int {
	n.sync.bmu.Lock()
	defer n.sync.bmu.Unlock()
	if b := n.sync.barriers[name]; b != nil {
		return len(b.in)
	}
	return 0
}
