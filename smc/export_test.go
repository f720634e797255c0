package smc

import (
	"fmt"
	"net"
	"time"
)

// State describes c's cursors, for failing tests.
func State(nc net.Conn) string {
	c := nc.(*Conn)
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("prod %d cons %d confirmed %d sent %d peerCons %d psize %d pbase %d ring %d base %d moving %v moved %v at %d next %d blocks %d blocked %v/%v err %v dropped %d",
		c.prod, c.cons, c.confirmed, c.sent, c.peerCons, c.psize, c.pbase, len(c.ring), c.base, c.moving, c.moved, c.moveAt, len(c.nextRing), c.blocks, c.peerBlocked, c.blockedSent, c.err, c.node.dropped.Load())
}

// SlabName is the export name of the slab c's receive buffer is in.
func SlabName(nc net.Conn) string {
	c := nc.(*Conn)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rmb.s == nil {
		return ""
	}
	return c.rmb.s.name
}

// SetShrinkAfter sets how long a grown buffer idles before it shrinks,
// for the test's duration.
func SetShrinkAfter(t interface{ Cleanup(func()) }, d time.Duration) {
	old := shrinkAfter
	shrinkAfter = d
	t.Cleanup(func() { shrinkAfter = old })
}

// Regions counts the peers' regions n keeps, and of them those learned
// for buffers offered mid-stream.
func Regions(n *Node) (cached, moved int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.regions {
		if l.moved {
			moved++
		}
	}
	return len(n.regions), moved
}

// IdleRegions is how many unused regions learned mid-stream a Node keeps.
const IdleRegions = idleRegions
