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
// (a cumulative ACK must never overtake the READ response before it). The
// drain runs only while the queue is not empty; the queue holds at most
// what the peer's requests and this node's own posts have in flight.

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

// drain writes the queue, waiting for the socket, until it is empty or the
// link fails (a killed link's connection is shut down, which ends a
// waiting write).
func (l *tcpLink) drain() {
	var chunk []byte
	for {
		l.wmu.Lock()
		if len(l.queued) == 0 || l.dead.Load() {
			l.queued = l.queued[:0]
			l.draining = false
			l.wmu.Unlock()
			return
		}
		chunk, l.queued = l.queued, chunk[:0]
		l.wmu.Unlock()
		if _, err := l.conn.Write(chunk); err != nil {
			l.kill()
		}
	}
}
