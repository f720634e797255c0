package soft

import (
	"net"
	"sync"
)

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

// queueChunk is the size of the pieces a link's queue is copied into.
// Chunks come from a pool and go back to it once written, so a queue never
// reallocates: a queue kept as one buffer that grew by append copied
// itself at each growth, megabytes at a time while the peer's READs
// filled it, and each growth was a large allocation the garbage collector
// could hold up for milliseconds (measured: 3-14 ms, with the link's write
// lock held, so the drain could not take the next chunk and the socket
// went idle: the stalls of 64 KiB READs on the TCP link).
const queueChunk = 64 << 10

// chunk is a piece of a link's queue: its first n bytes are queued.
type chunk struct {
	b *[queueChunk]byte
	n int
}

var chunkPool = sync.Pool{New: func() any { return new([queueChunk]byte) }}

// enqueue copies bufs, past their first skip bytes, to the queue.
func (l *tcpLink) enqueue(bufs net.Buffers, skip int) {
	for _, b := range bufs {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		b, skip = b[skip:], 0
		for len(b) > 0 {
			if k := len(l.queued); k == 0 || l.queued[k-1].n == queueChunk {
				l.queued = append(l.queued, chunk{b: chunkPool.Get().(*[queueChunk]byte)})
			}
			c := &l.queued[len(l.queued)-1]
			k := copy(c.b[c.n:], b)
			c.n += k
			b = b[k:]
		}
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
// waiting write), then pumps the QPs that held off meanwhile. It takes
// the whole queue at once, swapping in the chunk list it wrote last time,
// and writes it with writev.
func (l *tcpLink) drain() {
	var spare []chunk
	var bufs net.Buffers
	for {
		l.wmu.Lock()
		if len(l.queued) == 0 || l.dead.Load() {
			putChunks(l.queued)
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
		chunks := l.queued
		l.queued = spare[:0]
		l.wmu.Unlock()
		bufs = bufs[:0]
		for _, c := range chunks {
			bufs = append(bufs, c.b[:c.n])
		}
		w := bufs // WriteTo consumes its receiver
		_, err := w.WriteTo(l.conn)
		clear(bufs)
		putChunks(chunks)
		spare = chunks[:0]
		if err != nil {
			l.kill()
		}
	}
}

// putChunks returns written chunks to the pool.
func putChunks(cs []chunk) {
	for i := range cs {
		chunkPool.Put(cs[i].b)
		cs[i] = chunk{}
	}
}
