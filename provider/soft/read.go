package soft

import (
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// Who reads a TCP link.
//
// Across processes an 8 B READ is two socket writes and two socket reads;
// what decides its latency on a small machine is how many goroutines and
// threads each read wakes. If the link's own reader goroutine read the
// response, it would have to wake the goroutine parked in CQ.Wait: a
// goroutine hand-off, and the runtime waking a second thread for an idle P
// that then spins on a core the peer process needs.
//
// So reading a link is a role that moves. The link's reader goroutine (the
// background reader) holds it by default and always serves the peer. A
// goroutine that waits on a CQ whose requests went out on the link (the CQ
// remembers the link its QPs last used) takes the role while it waits and
// reads the link itself, like a C program blocking in recv: the response
// wakes the very goroutine that wants it. When that goroutine has its
// completion it leaves the role lent rather than giving it back, because it
// usually comes back to wait within microseconds and giving it back would
// cost the wake-up being avoided. A lent link has no reader, so:
//
//   - the background reader takes it back lendTimeout after it was lent
//     unless someone took it meanwhile (interrupt moderation, in effect: a
//     request from the peer may wait that long while the local application
//     neither waits nor polls);
//   - a goroutine that keeps polling a CQ without waiting (a busy poller,
//     or a waiter spinning before it sleeps) reads the CQ's lent link
//     itself now and then, without waiting for data;
//   - a waiter that cannot tell which link its completions come on (its
//     CQ has none yet, or its QPs use links to several peers) hands every
//     lent link back before it parks;
//   - a waiter that finds the link read by someone else asks for the role
//     and parks; the reader, the background reader or another waiter, lends
//     it to the waiters that asked once no whole frame is left in its
//     buffer. A waiter reading gives the role up when asked (one waiting
//     long, for messages say, yields to one that waits for a response
//     every few microseconds) and sleeps until the link is released with
//     nobody asking, when it is rung to take the role back; if the one it
//     yielded to got its completion (it will likely be back at once), only
//     once the background reader, looking every yieldCheck, finds the
//     link unread for yieldGrace (see keep).
//
// The role passes only between frames. A waiter blocked reading is
// interrupted with a past read deadline when its context ends or a
// completion reaches its CQ from elsewhere (another link, the in-memory
// wire, a closing CQ or node).

// Read roles of a TCP link.
const (
	roleBackground = iota // the link's reader goroutine reads
	roleLent              // nobody reads; a waiter may take it
	roleWaiter            // a goroutine in CQ.Wait reads
	roleDead              // the link is closed
)

// lendTimeout bounds how long a link stays lent, unread, before its
// background reader takes it back: the reader looks every lendTimeout
// while a waiter holds or borrows the role, and takes it if it has been
// lent for half that. Shorter costs more: those periodic timer wake-ups,
// in both processes, measurably slowed a tight request loop on two cores
// at 0.5-2 ms (krbench's 8 B READ against the TCP round trip).
const lendTimeout = 5 * time.Millisecond

// readLoop is the link's background reader: it reads while it holds the
// read role and waits for the role while a waiter holds or borrows it. It
// ends when the connection fails, killing the link and closing the
// connection (kill only shuts it down: it may run inside a read).
func (n *Node) readLoop(l *tcpLink, conn net.Conn) {
	defer conn.Close()
	defer l.kill()
	rd := newLinkReader(l, conn)
	l.rmu.Lock()
	l.rd = rd
	l.rmu.Unlock()
	// A waiter asked for the role. It is lent only once serve has
	// returned: from then on the reader is someone else's.
	asked := func() bool { return l.nwant.Load() > 0 }
	for {
		if err := rd.serve(asked, nil); err != nil {
			return
		}
		if !l.lendToWanters() {
			continue
		}
		l.flushAcks()
		if !l.awaitRole() {
			return
		}
	}
}

// lendToWanters lends the role to the waiters that asked for it and rings
// their CQs; the background reader holds the role.
func (l *tcpLink) lendToWanters() bool {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if len(l.wanters) == 0 || l.role != roleBackground {
		return false
	}
	l.lendLocked()
	return true
}

// lendLocked lends the role (l.rmu held) and rings any waiter that asked.
// It touches no timer: re-arming one here, in the waiter's path, can wake
// a thread (the runtime wakes its netpoller for an earlier deadline), the
// very cost the role saves. The background reader keeps its own timer.
func (l *tcpLink) lendLocked() {
	l.role = roleLent
	l.node.lent.Add(1)
	l.lentAt = l.node.now()
	for _, c := range l.wanters {
		c.ringBell()
	}
}

// awaitRole waits until the background reader has the role again: kicked,
// or the link stayed lent for lendTimeout. While a waiter holds or borrows
// the role the background reader looks every lendTimeout, every
// yieldCheck while waiters that yielded the role wait (see keep). It
// reports false once the link is dead.
func (l *tcpLink) awaitRole() bool {
	n := l.node
	for {
		wait := lendTimeout
		l.rmu.Lock()
		if len(l.yielders) > 0 {
			wait = yieldCheck
		}
		switch l.role {
		case roleDead:
			l.rmu.Unlock()
			return false
		case roleBackground:
			l.rmu.Unlock()
			return true
		case roleLent:
			idle := time.Duration(n.now() - l.lentAt)
			graceOver := len(l.yielders) > 0 && len(l.wanters) == 0 && idle >= yieldGrace
			if graceOver {
				l.ringYieldersLocked() // they take the role back (see keep)
			}
			if idle >= lendTimeout/2 && !graceOver {
				l.role = roleBackground
				n.lent.Add(-1)
				l.rmu.Unlock()
				return true
			}
			// Kept for less than yieldGrace: looked at again at the
			// next tick, not sooner. A shorter timer here, re-armed
			// whenever it found the link just kept again (a poller
			// keeps it at every poll), would tick at yieldGrace.
			wait = min(wait, lendTimeout-idle)
		}
		l.rmu.Unlock()
		l.lendTimer.Reset(wait)
		select {
		case <-l.kick:
		case <-l.lendTimer.C:
		}
	}
}

// activate gives a lent link back to its background reader.
func (l *tcpLink) activate() {
	l.rmu.Lock()
	if l.role == roleLent {
		l.role = roleBackground
		l.node.lent.Add(-1)
		l.kickReader()
	}
	l.rmu.Unlock()
}

func (l *tcpLink) kickReader() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// activateLent gives every lent link back to its background reader: a
// goroutine is waiting, or polling, for something no one reads.
func (n *Node) activateLent() {
	n.linkMu.Lock()
	for _, l := range n.tcp {
		l.activate()
	}
	n.linkMu.Unlock()
}

// Results of claim.
const (
	claimNone  = iota // the link is dead or has no reader yet
	claimTaken        // the caller reads the link now
	claimAsked        // someone else reads; the caller is a wanter
)

// claim is a waiter on c asking for the read role of l: it takes it if
// lent, or else asks to be rung when it is.
func (l *tcpLink) claim(c *cq) int {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	switch {
	case l.role == roleDead || l.rd == nil:
		return claimNone
	case l.role == roleLent:
		l.role = roleWaiter
		l.node.lent.Add(-1)
		return claimTaken
	}
	for _, w := range l.wanters {
		if w == c {
			return claimAsked
		}
	}
	l.wanters = append(l.wanters, c)
	l.nwant.Add(1)
	return claimAsked
}

// take takes the role if it is lent, asking for nothing otherwise.
func (l *tcpLink) take() bool {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.role != roleLent || l.rd == nil {
		return false
	}
	l.role = roleWaiter
	l.node.lent.Add(-1)
	return true
}

// unwant withdraws c's request for the role.
func (l *tcpLink) unwant(c *cq) {
	l.rmu.Lock()
	dropWanter(&l.wanters, &l.nwant, c)
	l.rmu.Unlock()
}

// dropWanter removes c from the waiters asking for a link's role, *ws,
// whose count is n; the caller holds the lock guarding them.
func dropWanter(ws *[]*cq, n *atomic.Int32, c *cq) {
	for i, w := range *ws {
		if w == c {
			*ws = append((*ws)[:i], (*ws)[i+1:]...)
			n.Add(-1)
			return
		}
	}
}

// keep ends the turn of a waiter that got what it waited for (or of a
// poller): the role is lent and the waiters that asked for it are rung, but
// not those that gave it up earlier. The waiter is usually back within
// microseconds; ringing them at once would have one of them take the role
// back and read the waiter's next response, which then costs a goroutine
// hand-off. They are rung when the background reader, which looks every
// yieldCheck while they wait, finds the link lent for yieldGrace
// (awaitRole). keep arms no timer of its own: re-arming one at every keep
// (a timer per round trip, earlier than the netpoller's sleep) woke a
// thread each time and ran a goroutine when it fired, which doubled an 8 B
// smc round trip on the TCP link (MEASUREMENTS.md, session 21).
func (l *tcpLink) keep() {
	l.rmu.Lock()
	if l.role == roleWaiter {
		l.lendLocked()
	}
	l.rmu.Unlock()
}

// yieldGrace is how long a kept link may stay unread before the waiters
// that yielded it take it back: longer than an application takes between
// two requests, short against a message round trip it may be waiting for.
const yieldGrace = 50 * time.Microsecond

// yieldCheck is how often the background reader looks whether a kept link
// has stayed unread for yieldGrace while waiters that yielded it wait: it
// bounds how late their messages are read when the waiter they yielded to
// stops reading. A tick of the background reader, not a timer re-armed at
// every keep.
const yieldCheck = time.Millisecond

// release ends a waiter's turn at reading: the role is lent, and the
// waiters that asked for it are rung; if none did, so are those that gave
// the role up to them (they take it back). yielder, if not nil, is the CQ
// of a waiter giving the role up to those that asked.
func (l *tcpLink) release(yielder *cq) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.role != roleWaiter {
		return
	}
	l.lendLocked()
	if yielder != nil {
		if !slices.Contains(l.yielders, yielder) {
			l.yielders = append(l.yielders, yielder)
			if len(l.yielders) == 1 {
				l.kickReader() // to look every yieldCheck from now
			}
		}
		return
	}
	if len(l.wanters) == 0 {
		l.ringYieldersLocked()
	}
}

// ringYieldersLocked tells the waiters that gave the role up that it is
// free again (they take it back).
func (l *tcpLink) ringYieldersLocked() {
	for _, c := range l.yielders {
		c.unyield.Store(true)
		c.ringBell()
	}
	clear(l.yielders)
	l.yielders = l.yielders[:0]
}

// interrupt wakes the waiter blocked reading the link.
func (l *tcpLink) interrupt() {
	l.conn.SetReadDeadline(aLongTimeAgo)
}

// readFor is a waiter on c reading l, whose role it holds, until c has a
// completion (or an error to report) or the waiter's context ends. It
// reports false if the link failed.
func (c *cq) readFor(l *tcpLink) bool {
	err := l.rd.serve(c.readStop, &c.rblocked)
	return err == nil
}

// stopReading tells a waiter of c reading a link to stop: c has something
// for it, its context (c.rctx) ended, or another goroutine asked for the
// link (see Wait).
func (c *cq) stopReading() bool {
	return c.ready.Load() > 0 || c.stopped() || c.rctx.Err() != nil || c.rlink.Load().nwant.Load() > 0
}
