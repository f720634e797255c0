//go:build linux

package soft

import "fmt"

// PlaceState says how from reaches to and, on a shared-memory link, what
// from's in-place view of to is: for a test that found a request it
// expected in place on the ring instead.
func PlaceState(from, to *Node) string {
	kind, why := from.PeerLink(to.addr)
	from.linkMu.Lock()
	l := from.shm[to.addr]
	from.linkMu.Unlock()
	if kind != "shm" || l == nil {
		return fmt.Sprintf("link %q (shm dial: %v; shm listener of the peer: %v)", kind, why, to.shmWhy)
	}
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	if l.segGone {
		return "link shm, finished"
	}
	l.place.mu.Lock()
	mapped, broken, maps := l.place.table != nil, l.place.broken, len(l.place.maps)
	l.place.mu.Unlock()
	return fmt.Sprintf("link shm (side %d, peer pid %d): peer's table published %v, mapped %v, broken %v; %d memfds mapped; peer alive %v, closing %v, dead %v",
		l.side, l.pid, l.seg.exportLine(1 - l.side)[0].Load() != 0, mapped, broken, maps,
		l.seg.peerAlive(1-l.side), l.seg.closing().Load() != 0, l.dead.Load())
}

// ShmListenErr is why n has no shared-memory listener (nil if it has one,
// or does not listen).
func ShmListenErr(n *Node) error { return n.shmWhy }
