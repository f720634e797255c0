package soft

import "net"

// Who writes a TCP link, and when nobody may wait.
//
// A link's reader writes too: the responses and ACKs to the requests it
// reads. If that write waited for a full socket while the peer's reader
// did the same (both answering large READs), neither would read again and
// both sides' requests would end in RETRY_EXC_ERR. So only the link's
// drain goroutine ever waits for the socket: a write takes what the socket
// accepts now and queues the rest, copied, for the drain; once anything is
// queued every later write queues behind it, which keeps the link's order
// (a cumulative ACK must never overtake the READ response before it).
//
// Requesters do not add to the queue while it drains: a QP's pump that
// finds the link backlogged stops before taking its next request off the
// send queue (holdOff) and the drain pumps it again once the queue is
// written, as an RNIC fetches WQEs only as fast as its port transmits. So
// a stream of large WRITEs or SENDs goes from registered memory to the
// socket by writev, and what is copied is bounded by one pump batch per
// time the socket fills, plus the responses the reader answers meanwhile.

// writeLocked writes bufs to the link, queueing what the socket does not
// take now; l.wmu is held.
func (l *tcpLink) writeLocked(bufs net.Buffers) error {
	if len(l.queued) > 0 || l.draining {
		l.enqueue(bufs, 0)
		return nil
	}
	if l.wsock == nil {
		l.wsock = newRawWriter(l.conn)
	}
	n, err := l.wsock.tryWrite(bufs)
	if err != nil {
		return err
	}
	l.enqueue(bufs, n)
	if len(l.queued) > 0 {
		l.draining = true
		go l.drain()
	}
	return nil
}

// enqueue copies bufs, past their first skip bytes, to the queue.
func (l *tcpLink) enqueue(bufs net.Buffers, skip int) {
	for _, b := range bufs {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		l.queued = append(l.queued, b[skip:]...)
		skip = 0
	}
}

// holdOff reports whether q's pump should stop before its next request
// because the link's queue is draining; if so, the drain pumps q when it
// is done. q.mu is held.
func (l *tcpLink) holdOff(q *qp) bool {
	if l.dead.Load() {
		return false
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if !l.draining {
		return false
	}
	if len(l.held) == 0 || l.held[len(l.held)-1] != q {
		l.held = append(l.held, q)
	}
	return true
}

// drain writes the queue, waiting for the socket, until it is empty or the
// link fails (a killed link's connection is shut down, which ends a
// waiting write), then pumps the QPs that held off meanwhile. The two
// buffers it swaps with the queue are the link's, so a link that fills
// its socket again and again does not grow new ones each time.
func (l *tcpLink) drain() {
	for {
		l.wmu.Lock()
		if len(l.queued) == 0 || l.dead.Load() {
			l.queued = l.queued[:0]
			l.draining = false
			held := l.held
			l.held = nil
			l.wmu.Unlock()
			for _, q := range held {
				q.pump()
			}
			return
		}
		chunk := l.queued
		l.queued = l.spare[:0]
		l.spare = nil
		l.wmu.Unlock()
		_, err := l.conn.Write(chunk)
		l.wmu.Lock()
		l.spare = chunk[:0]
		l.wmu.Unlock()
		if err != nil {
			l.kill()
		}
	}
}
