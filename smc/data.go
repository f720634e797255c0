package smc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/verbs"
)

// Bounds of the data path.
const (
	// opTimeout bounds one RDMA request's completion; past it the
	// connection is aborted (the request may still land, so the ring's
	// state is unknown).
	opTimeout = 10 * time.Second
	// closeGrace is how long a connection whose TCP connection ended
	// waits for the peer's close flag, which travels over krcore and may
	// arrive after the FIN, before it takes the peer for dead.
	closeGrace = time.Second
	// linger bounds how long a closed connection keeps its receive buffer
	// for a peer that has not said it writes no more.
	linger = 10 * time.Second
)

// A connection's CDC messages are sent from slots behind the data in its
// staging buffer, one per message in flight.
const (
	cdcSlot    = 128 // a CDC message, or a moveMsg
	cdcSlots   = 4
	stageExtra = cdcSlot * cdcSlots
)

// link is a connection's SMC state: its receive buffer (the RMB element
// its peer WRITEs into), its staging buffer (a ring that WRITEs are sent
// from, then the CDC slots), its queue to the peer and the cursors of
// both directions. Cursors are stream positions; a buffer holds the
// positions from its base on, as a ring.
type link struct {
	token    uint32
	pToken   uint32
	start    int // the size of the buffers it started with
	rmb      buffer
	stage    buffer
	ring     []byte        // rmb's bytes
	base     uint64        // the stream position at ring's start
	q        *sharedQueue  // to the peer's port
	peer     krcore.Region // learned from the Node (region), given back by putRegion
	peerKey  regionKey     // peer's key at the Node
	peerOff  uint64        // the peer's element in peer
	psize    int           // the peer's element's size
	pbase    uint64        // the stream position at the start of the peer's element
	peerNode krcore.NodeID
	peerAt   krcore.Principal // the peer's endpoint, q's destination

	// key is this side's secret for the connection, named in its CLC
	// message; pKey the peer's: each CDC and move message carries its
	// receiver's (cdcMsg). Drawn from crypto/rand per connection.
	key, pKey uint64

	// mu guards the cursors and flags below; the staging buffer and q are
	// used under qmu (held by whoever posts), and released says, under
	// qmu, that they are gone.
	mu       sync.Mutex
	qmu      sync.Mutex
	released bool

	prod      uint64 // bytes the peer wrote into ring (its notifications)
	cons      uint64 // bytes the application read
	confirmed uint64 // cons as last sent to the peer
	sent      uint64 // bytes written into the peer's ring
	freed     uint64 // bytes whose WRITEs completed: sent-freed hold the staging ring
	peerCons  uint64 // the peer's consumer cursor: sent-peerCons is in flight
	cdcSent   uint64 // CDC messages pushed
	cdcDone   uint64 // and completed: cdcSent-cdcDone hold CDC slots
	seq       uint16

	// A receive buffer that grows: next is offered to the peer (moving),
	// which WRITEs into it from moveAt on once it said so (moved); the
	// reader moves to it once ring is read up to moveAt. blocks counts
	// the peer's waits for window since the last offer, lags those of
	// them for which it said it lags its window (flagWindowLag).
	next          buffer
	nextRing      []byte
	moving, moved bool
	moveAt        uint64
	blocks, lags  int
	moveTo        *moveMsg // the peer's offer, for the keeper to apply

	// Urgent data (urgent.go): the last urgent byte not yet read by
	// ReadUrgent, and its stream position, which reads skip.
	urgByte           byte
	urgValid, urgSkip bool
	urgMark           uint64

	peerBlocked, blockedSent    bool
	peerDoneWriting, peerClosed bool
	wrShut, localClosed, live   bool
	lent                        bool // WriteTo hands ring bytes to a writer: keep the buffer
	// grace is closeGrace's timer once the TCP connection ended
	// (watchTCP), lingerT linger's once closed here, ackT ackDelay's
	// once the peer closed first (onCDC); gone says the connection was
	// released: no timer is needed then. keeping: the keeper runs, or
	// the release ran without it (endNow); lingered: linger passed.
	grace, lingerT, ackT *time.Timer
	gone, keeping        bool
	lingered             bool
	// lateStage is the staging buffer of a released connection whose
	// last requests are in flight: their completion gives it back.
	lateStage buffer
	err       error // fatal: reads drain, then fail with it

	rxSig, txSig, kick chan struct{} // capacity 1: wake the reader, writer, keeper

	// lagging: the writer's last wait for window took lagWait or more
	// (flagWindowLag); under wrMu.
	lagging bool
}

// signal wakes one waiter on ch, if none is pending already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// setupQueue takes a staging buffer and a token: what this side names in
// its proposal or accept. With wait false it fails with errWouldWait
// rather than register a slab.
func (c *Conn) setupQueue(wait bool) (Reason, error) {
	n := c.node
	c.start = n.firstSize()
	if c.opts.BufferSize != 0 {
		c.start = c.opts.BufferSize
	}
	var err error
	if c.stage, err = n.stagePool(c.start).take(wait); err != nil {
		return ReasonMem, err
	}
	c.mu.Lock() // onCDC reads the key under mu
	c.key = nonce.Uint64()
	c.mu.Unlock()
	tok, err := n.register(c)
	if err != nil {
		return ReasonInternal, err
	}
	c.mu.Lock() // Node.Conns reads the token under mu
	c.token = tok
	c.mu.Unlock()
	return ReasonNone, nil
}

// setupRMB takes a receive buffer from the slabs exported to the peer
// endpoint alone (with wait false, from the slabs there are).
func (c *Conn) setupRMB(peer krcore.Principal, wait bool) (Reason, error) {
	b, err := c.node.rmbPool(peer, c.start, !c.server).take(wait)
	if errors.Is(err, errNoMemory) {
		return ReasonMem, err
	}
	if err != nil {
		return ReasonRegRMB, err
	}
	// Under mu, as onData reads the ring: the peer's first WRITE follows
	// the accept over TCP, an order the race detector cannot see.
	c.mu.Lock()
	c.rmb, c.ring = b, b.bytes(c.start)
	c.mu.Unlock()
	return ReasonNone, nil
}

// connectPeer points the queue at the peer's port, named in m (a
// proposal or an accept): notifications from its node count from now on.
// With wait false it fails with errWouldWait rather than connect a new
// queue.
func (c *Conn) connectPeer(ctx context.Context, m *clcMsg, wait bool) (Reason, error) {
	if m.token == 0 || m.port == 0 {
		return ReasonConfig, fmt.Errorf("smc: the peer's token %d, port %d: %w", m.token, m.port, krcore.ErrInvalid)
	}
	c.mu.Lock()
	c.peerNode, c.pToken, c.pKey = m.node, m.token, m.key
	c.mu.Unlock()
	c.peerAt = krcore.Principal{Node: m.node, Port: m.port}
	q, err := c.node.queue(ctx, c.peerAt, wait)
	if err != nil {
		return ReasonLink, err
	}
	c.q = q
	return ReasonNone, nil
}

// learnBuffer learns the peer's receive buffer from m (an accept or a
// confirm), asking as this Node's port, the one it was exported to.
func (c *Conn) learnBuffer(ctx context.Context, m *clcMsg) (Reason, error) {
	if m.size < cdcLen || m.size > maxBuffer {
		return ReasonConfig, fmt.Errorf("smc: the peer's buffer of %d bytes: %w", m.size, krcore.ErrInvalid)
	}
	r, err := c.node.region(ctx, m.node, m.name, false)
	if err != nil {
		return ReasonLink, err
	}
	if r.Len() < uint64(m.off)+uint64(m.size) {
		c.node.putRegion(m.node, m.name)
		return ReasonConfig, fmt.Errorf("smc: the peer's buffer at %d+%d is outside its region of %d bytes: %w", m.off, m.size, r.Len(), krcore.ErrInvalid)
	}
	k := regionKey{m.node, m.name}
	if err := c.node.claimPeer(c, k, uint64(m.off), uint64(m.size)); err != nil {
		c.node.putRegion(m.node, m.name)
		return ReasonConfig, err
	}
	c.mu.Lock()
	c.peer, c.peerKey, c.psize, c.peerOff = r, k, int(m.size), uint64(m.off)
	c.mu.Unlock()
	return ReasonNone, nil
}

// mayWrite reports whether the connection may still WRITE into its
// peer's buffer: it has not said it writes no more (wrShut is set before
// the flag goes out) nor failed.
func (c *Conn) mayWrite() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.wrShut && c.err == nil
}

// offer describes this side's buffer in a CLC message of type typ.
func (c *Conn) offer(typ byte) *clcMsg {
	n := c.node
	m := &clcMsg{typ: typ, peerID: n.id, node: n.api.Node(), port: n.port, token: c.token, key: c.key}
	if c.rmb.s != nil { // a proposal offers none yet
		m.off, m.size, m.name = uint32(c.rmb.off), uint32(len(c.ring)), c.rmb.s.name
	}
	return m
}

// startSMC begins the connection's SMC life: the keeper and the watcher
// of the TCP connection.
func (c *Conn) startSMC() {
	c.beginSMC()
	go c.watchTCP()
}

// beginSMC begins the connection's SMC life; the caller runs the watcher
// of the TCP connection (watchTCP). The Node's wait group counts the
// watcher and the keeper, which starts at its first task (nudge) or
// never (endNow).
func (c *Conn) beginSMC() {
	c.mu.Lock()
	c.live = true
	c.mu.Unlock()
	c.node.wg.Add(2)
	if len(c.kick) > 0 { // a task came before the connection went live
		c.nudge()
	}
}

// nudge wakes the keeper, starting it if it does not run yet. A
// connection's keeper starts at its first task (a peer blocked on
// window, a move, a resize, an ack, a failure), so that a short
// connection whose ends close in turn starts none: its release runs
// where the last close is seen (endNow).
func (c *Conn) nudge() {
	c.mu.Lock()
	start := c.live && !c.keeping && !c.gone
	if start {
		c.keeping = true
	}
	c.mu.Unlock()
	if start {
		go c.keep()
	}
	signal(c.kick)
}

// endResult is what endNow did.
type endResult int

const (
	ended    endResult = iota // released here
	waitPeer                  // closed here, the peer not done: its close or linger ends it
	keeper                    // for the keeper (it runs, or something is held): nudge it
)

// endNow releases a connection closed here whose peer writes no more,
// in the calling goroutine, when no keeper runs and nothing is held (a
// lent ring, qmu, a failure's cleanup): release does not wait, so the
// goroutine that sees the last close (Close, or the dispatch of the
// peer's close flag) ends the connection without a keeper's wake-up.
func (c *Conn) endNow() endResult {
	if !c.qmu.TryLock() {
		return keeper
	}
	c.mu.Lock()
	r := keeper
	switch {
	case c.keeping || c.gone || !c.localClosed || c.lent || c.err != nil || c.lingered:
	case !c.peerDoneWriting:
		r = waitPeer
	default:
		r, c.keeping = ended, true // no keeper starts from here on
	}
	c.mu.Unlock()
	if r != ended {
		c.qmu.Unlock()
		return r
	}
	c.releaseLocked()
	c.qmu.Unlock()
	c.node.wg.Done() // the keeper's count: it never ran
	return ended
}

// releaseLocal gives back what setupQueue and setupRMB took, for a
// connection that never ran SMC or has ended and whose peer WRITEs no
// more into its receive buffer.
func (c *Conn) releaseLocal() { c.releaseAs(false) }

// releaseFenced is releaseLocal for a connection whose peer may still
// WRITE into its receive buffer (it never said it writes no more): the
// buffer is fenced (bufPool.fence) instead of handed to a later
// connection.
func (c *Conn) releaseFenced() { c.releaseAs(true) }

// releaseAs is releaseLocal, fencing the receive buffers if fence.
func (c *Conn) releaseAs(fence bool) {
	n := c.node
	if c.token != 0 {
		n.unregister(c.token)
	}
	if c.q != nil {
		c.mu.Lock()
		healthy := c.err == nil
		c.mu.Unlock()
		n.putQueue(c.peerAt, c.q, healthy)
	}
	if c.stage.s != nil {
		c.stage.s.pool.put(c.stage)
	}
	for _, b := range []buffer{c.rmb, c.next} {
		switch {
		case b.s == nil:
		case fence:
			b.s.pool.fence(b)
		default:
			b.s.pool.put(b)
		}
	}
	c.mu.Lock() // Node.Conns reads the token under mu
	peer, key, off := c.peer, c.peerKey, c.peerOff
	c.token, c.q, c.stage, c.rmb, c.next, c.peer = 0, nil, buffer{}, buffer{}, buffer{}, nil
	c.mu.Unlock()
	if peer != nil {
		n.unclaimPeer(c, key, off)
		n.putRegion(key.node, key.name)
	}
}

// readSMC copies what the peer wrote into the ring, waiting for at least
// one byte, and returns the consumer cursor to the peer when RFC 7609's
// window rule says so.
func (c *Conn) readSMC(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		c.mu.Lock()
		if c.localClosed { // the ring may be another connection's by now
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		if c.prod > c.cons {
			k, old := c.copyOut(p)
			update := c.wantUpdate()
			c.mu.Unlock()
			giveBack(old)
			if update {
				c.sendCDC(0, 0) // a failure shows on the next call
			}
			if k > 0 {
				return k, nil
			}
			continue // the urgent byte alone, skipped
		}
		err := c.err
		switch {
		case c.peerDoneWriting:
			err = io.EOF
		}
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if err := c.waitRx(); err != nil {
			return 0, err
		}
	}
}

// waitRx waits for the reader's signal or the port (await), unless the
// read deadline passed or the connection closed.
func (c *Conn) waitRx() error {
	dl := c.rd.wait()
	select {
	case <-dl:
		return os.ErrDeadlineExceeded
	case <-c.done:
		return net.ErrClosed
	default:
	}
	c.await(c.rxSig, dl)
	return nil
}

// copyOut moves what it can of the bytes arrived into p; c.mu held. It
// returns the receive buffer the connection moved away from, if it did,
// to give back once c.mu is released.
func (c *Conn) copyOut(p []byte) (int, buffer) {
	n := 0
	var old buffer
	for n < len(p) {
		b, o := c.chunk()
		if o.s != nil {
			old = o
		}
		if len(b) == 0 {
			break
		}
		k := copy(p[n:], b)
		c.cons += uint64(k)
		n += k
		if c.urgSkip && c.cons == c.urgMark {
			break // a read stops at the urgent mark, as TCP's does
		}
	}
	return n, old
}

// chunk is the bytes arrived at the consumer cursor that lie together in
// the ring. A ring read up to where the peer moved to the next buffer is
// left for that one first, and returned to give back once c.mu is
// released; c.mu held.
func (c *Conn) chunk() ([]byte, buffer) {
	if c.urgSkip && c.cons == c.urgMark { // read out of band (ReadUrgent)
		c.cons++
		c.urgSkip = false
	}
	old := c.switchRing()
	end := c.prod
	if c.moved {
		end = c.moveAt
	}
	if c.urgSkip {
		end = min(end, c.urgMark)
	}
	size := uint64(len(c.ring))
	off := (c.cons - c.base) % size
	return c.ring[off : off+min(end-c.cons, size-off)], old
}

// switchRing moves reading to the next ring once the peer moved there
// and the ring is read up to that point, and returns the old buffer to
// give back once c.mu is released; c.mu held.
func (c *Conn) switchRing() buffer {
	if !c.moved || c.cons != c.moveAt {
		return buffer{}
	}
	old := c.rmb
	c.rmb, c.ring, c.base = c.next, c.nextRing, c.moveAt
	c.next, c.nextRing, c.moving, c.moved = buffer{}, nil, false, false
	return old
}

// giveBack returns a receive buffer the connection moved away from.
func giveBack(b buffer) {
	if b.s != nil {
		b.s.pool.put(b)
	}
}

// wantUpdate is RFC 7609's rule, as Linux applies it, for returning the
// consumer cursor: not per byte read, but once more than a tenth of the
// buffer was read since the last update and the sender either has no
// more than half of the buffer free or said it is blocked, or at once
// when the sender asked; c.mu held.
func (c *Conn) wantUpdate() bool {
	unconfirmed := c.cons - c.confirmed
	if unconfirmed == 0 {
		return false
	}
	size, start := c.writeRing()
	// What the sender believes it may write: bytes before start are in
	// a buffer it no longer writes.
	free := size - (c.prod - max(c.confirmed, start))
	return unconfirmed > size/10 && (free <= size/2 || c.peerBlocked)
}

// writeRing is the size of the ring the peer writes into now and the
// stream position at its start: the next ring once the peer moved there,
// the ring being read before; c.mu held.
func (c *Conn) writeRing() (size, start uint64) {
	if c.moved {
		return uint64(len(c.nextRing)), c.moveAt
	}
	return uint64(len(c.ring)), c.base
}

// overrun is how many bytes the peer wrote past its window; c.mu held.
func (c *Conn) overrun() uint64 {
	size, start := c.writeRing()
	in := c.prod - max(c.cons, start)
	return in - min(in, size)
}

// writeSMC WRITEs p into the peer's ring, as much as its window allows at
// a time, waiting for window when it is full; wrMu held.
func (c *Conn) writeSMC(p []byte) (int, error) { return c.writeSMCAs(p, false) }

// writeSMCAs is writeSMC; urgent sends p's one byte as urgent data
// (postUrgent); wrMu held.
func (c *Conn) writeSMCAs(p []byte, urgent bool) (int, error) {
	total := 0
	var waitFrom time.Time // this Write's wait for window began
	for len(p) > 0 {
		c.mu.Lock()
		err := c.txErr()
		// The bytes before pbase are in the peer's old buffer, which it
		// reads to the end before this one.
		free := c.psize - int(c.sent-max(c.peerCons, c.pbase))
		blocked := free == 0 && !c.blockedSent
		if free == 0 {
			c.blockedSent = true
		}
		c.mu.Unlock()
		if err == nil {
			select {
			case <-c.wd.wait():
				err = os.ErrDeadlineExceeded
			case <-c.done:
				err = net.ErrClosed
			default:
			}
		}
		if err != nil {
			return total, err
		}
		if free == 0 {
			if waitFrom.IsZero() {
				waitFrom = time.Now()
			}
			if blocked {
				flags := byte(flagWriteBlocked | flagCursorRequest)
				if c.lagging {
					flags |= flagWindowLag
				}
				c.sendCDC(flags, 0)
			}
			c.await(c.txSig, c.wd.wait())
			continue
		}
		c.pace(&waitFrom)
		var k int
		if urgent {
			k, err = c.postUrgent(p[0])
		} else {
			k, err = c.post(p[:min(len(p), free)])
		}
		if err != nil {
			return total, err
		}
		p, total = p[k:], total+k
	}
	return total, nil
}

// pace ends the writer's wait for window that began at *waitFrom, if
// one did: a wait of lagWait or more means the cursor takes long to come
// back, and the next blocked flag says so (flagWindowLag), for the
// receiver to grow its buffer past lagBuffer. wrMu held.
func (c *Conn) pace(waitFrom *time.Time) {
	if waitFrom.IsZero() {
		return
	}
	c.lagging = time.Since(*waitFrom) >= lagWait
	*waitFrom = time.Time{}
}

// txErr is why writing cannot go on, or nil; c.mu held.
func (c *Conn) txErr() error {
	switch {
	case c.localClosed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.peerClosed: // before wrShut: the keeper shuts writing when the peer closes
		return errPeerClosed
	case c.wrShut:
		return errWriteShut
	}
	return nil
}

// post stages the start of p and WRITEs it at the producer cursor of the
// peer's ring with a WRITE_WITH_IMM, whose notification (immediate: the
// peer's token; length: the bytes) moves the peer's producer cursor once
// the bytes are in place. It takes what fits before either ring wraps,
// and returns how much. It does not wait for the WRITE to complete (see
// sharedQueue), only for staging room while earlier WRITEs hold it all.
func (c *Conn) post(p []byte) (int, error) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.postLocked(p, true)
}

// postLocked is post with qmu held; without notify the WRITE carries no
// immediate and the peer learns of the bytes from a CDC message's
// producer cursor (urgent data).
func (c *Conn) postLocked(p []byte, notify bool) (int, error) {
	if c.released {
		return 0, net.ErrClosed
	}
	size := c.stageRing()
	c.mu.Lock()
	off, soff := int((c.sent-c.pbase)%uint64(c.psize)), int(c.sent%uint64(size))
	c.mu.Unlock()
	k := min(len(p), c.psize-off, size-soff)
	if err := c.settleWrite(func() bool { return c.sent-c.freed <= uint64(size-k) }); err != nil {
		return 0, err
	}
	copy(c.stage.bytes(size)[soff:], p[:k])
	r := krcore.Request{Op: verbs.OpWriteImm, Local: c.stage.s.mr.Range(c.stage.off+soff, k),
		Remote: c.peer.At(c.peerOff + uint64(off)), Imm: c.pToken}
	if !notify {
		r.Op, r.Imm = verbs.OpWrite, 0
	}
	// The cursor moves before the push: the peer may read the bytes and
	// return its consumer cursor before the completion comes back here.
	// A failed push aborts the connection, so no write follows it.
	c.mu.Lock()
	c.sent += uint64(k)
	c.blockedSent = false
	c.mu.Unlock()
	c.node.stats.sent.Add(uint64(k))
	c.node.stats.writes.Add(1)
	if err := c.q.push(r, owed{c: c, n: k}); err != nil {
		return 0, c.abort(err)
	}
	return k, nil
}

// settle waits until ok (run with c.mu held) reports true, popping the
// completions of the connection's queue; qmu held. A wait that fails
// aborts the connection.
func (c *Conn) settle(ok func() bool) error { return c.settleCtx(context.Background(), ok) }

// stageIdle reports that no request reads the staging buffer: every WRITE
// and CDC sent has completed; c.mu held.
func (c *Conn) stageIdle() bool { return c.sent == c.freed && c.cdcSent == c.cdcDone }

// settleWrite is settle for a Write, which also ends at the write
// deadline (os.ErrDeadlineExceeded) or Close (net.ErrClosed): those leave
// the connection as it was, nothing staged; qmu held.
func (c *Conn) settleWrite(ok func() bool) error {
	c.mu.Lock()
	done := ok()
	c.mu.Unlock()
	if done {
		return nil
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	go func() { // owned by this call: its cancel ends it
		select {
		case <-c.wd.wait():
			cancel(os.ErrDeadlineExceeded)
		case <-c.done:
			cancel(net.ErrClosed)
		case <-ctx.Done():
		}
	}()
	return c.settleCtx(ctx, ok)
}

// settleCtx is settle within ctx: a wait ended by ctx's cause is returned
// as that cause and leaves the connection as it was; qmu held.
func (c *Conn) settleCtx(ctx context.Context, ok func() bool) error {
	c.mu.Lock()
	done := ok()
	c.mu.Unlock()
	if done {
		return nil
	}
	err := c.q.settle(ctx, c, ok)
	if cause := context.Cause(ctx); err != nil && cause != nil {
		return cause
	}
	if err != nil {
		return c.abort(err)
	}
	return nil
}

// abort fails the connection with err, an RDMA request's failure, and
// returns the connection's error.
func (c *Conn) abort(err error) error {
	c.fail(fmt.Errorf("smc: RDMA to node %d: %w: %w", c.peerNode, errAborted, err))
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// stageRing is the size of the staging buffer's ring; qmu held.
func (c *Conn) stageRing() int { return c.stage.s.pool.size - stageExtra }

// sendCDC sends a CDC message with the cursors and the given flags, and
// records the consumer cursor it carries as confirmed.
func (c *Conn) sendCDC(prodFlags, connFlags byte) error {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.pushCDC(prodFlags, connFlags)
}

// pushCDC is sendCDC with qmu held.
func (c *Conn) pushCDC(prodFlags, connFlags byte) error {
	return c.pushCtl(func(slot []byte) []byte {
		c.seq++
		m := cdcMsg{seq: c.seq, token: c.pToken, key: c.pKey, prod: toCursor(c.sent, cursorSpan), cons: toCursor(c.cons, cursorSpan),
			prodFlags: prodFlags, connFlags: connFlags}
		c.confirmed = c.cons
		c.peerBlocked = false
		return m.encode(slot)
	})
}

// pushCtl SENDs a control message (CDC or moveMsg) to the peer's port,
// which fill writes into a free CDC slot of the staging buffer, with c.mu
// held; qmu held.
func (c *Conn) pushCtl(fill func(slot []byte) []byte) error {
	if c.released {
		return net.ErrClosed
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	if err := c.settle(func() bool { return c.cdcSent-c.cdcDone < cdcSlots }); err != nil {
		return err
	}
	ring := c.stageRing()
	c.mu.Lock()
	slot := ring + int(c.cdcSent%cdcSlots)*cdcSlot
	b := fill(c.stage.bytes(ring + stageExtra)[slot : slot+cdcSlot])
	c.cdcSent++
	c.mu.Unlock()
	r := krcore.Request{Op: verbs.OpSend, Local: c.stage.s.mr.Range(c.stage.off+slot, len(b))}
	c.node.stats.cdcs.Add(1)
	if err := c.q.push(r, owed{c: c, cdc: true}); err != nil {
		return c.abort(err)
	}
	return nil
}

// onData is the peer's WRITE_WITH_IMM notification: n more bytes are in
// the ring. A peer that writes past the window is aborted. It reports
// false for a notification from another node than the peer's.
func (c *Conn) onData(from krcore.NodeID, n int) bool {
	c.mu.Lock()
	if from != c.peerNode {
		c.mu.Unlock()
		return false
	}
	c.prod += uint64(n)
	c.node.stats.received.Add(uint64(n))
	if over := c.overrun(); over > 0 && c.err == nil {
		c.err = fmt.Errorf("smc: the peer wrote %d bytes past the window: %w", over, errAborted)
		c.signalSig(c.txSig)
	}
	c.mu.Unlock()
	c.signalSig(c.rxSig)
	return true
}

// onCDC applies the peer's CDC message: its consumer cursor opens the
// window, its flags say it is blocked, done writing, closed or aborted.
// It reports false for a message from another node than the peer's or
// without the connection's key.
func (c *Conn) onCDC(from krcore.NodeID, m cdcMsg) bool {
	c.mu.Lock()
	if from != c.peerNode || m.key != c.key {
		c.mu.Unlock()
		return false
	}
	// A client's first CDC can come before its server learned the
	// client's buffer (psize 0): it carries no cursor of bytes sent yet.
	// Only the goroutines the message concerns are woken: a window update
	// (the common message of a stream) wakes the writer alone, not also
	// the reader and the keeper, each a wake-up on a loaded core.
	window := false
	if c.psize > 0 {
		if v := fromCursor(m.cons, cursorSpan, c.peerCons); v > c.peerCons && v <= c.sent {
			c.peerCons, window = v, true
		}
	}
	keep := m.prodFlags&(flagWriteBlocked|flagCursorRequest) != 0
	if keep {
		c.peerBlocked = true
	}
	if m.prodFlags&flagWriteBlocked != 0 {
		c.blocks++
		if m.prodFlags&flagWindowLag != 0 {
			c.lags++
		}
	}
	if m.connFlags&flagMoved != 0 {
		c.onMoved(fromCursor(m.prod, cursorSpan, c.prod))
	}
	urgent := m.prodFlags&flagUrgPresent != 0
	if urgent {
		c.onUrgent(fromCursor(m.prod, cursorSpan, c.prod))
	}
	state := m.connFlags&(flagDoneWriting|flagConnClosed|flagAbnormal|flagMoved) != 0
	if m.connFlags&(flagDoneWriting|flagConnClosed) != 0 {
		c.peerDoneWriting = true
	}
	if m.connFlags&flagConnClosed != 0 {
		c.peerClosed = true
	}
	if m.connFlags&flagAbnormal != 0 && c.err == nil {
		c.err = fmt.Errorf("smc: the peer aborted: %w", errAborted)
	}
	closing := m.connFlags&(flagDoneWriting|flagConnClosed|flagAbnormal) != 0
	local, running := c.localClosed, c.keeping
	deferAck := closing && !local && !running && !keep && m.connFlags&flagMoved == 0
	if deferAck && c.ackT == nil && c.peerClosed && !c.wrShut && c.err == nil {
		c.ackT = time.AfterFunc(ackDelay, c.nudge)
	}
	c.mu.Unlock()
	if state || urgent {
		c.signalSig(c.rxSig)
	}
	if window || state {
		c.signalSig(c.txSig)
	}
	switch {
	case closing && local:
		if c.endNow() != ended {
			c.nudge()
		}
	case deferAck:
	case keep || state:
		c.nudge()
	}
	return true
}

// ackDelay is how long a connection whose peer closed first waits for its
// application's Close (which tells the peer in its close message) before
// the keeper tells the peer that this side writes no more, so that the
// peer can release its buffers: the common application closes at the
// EOF its read returns, and the ack would be one CDC message and a
// wake-up more.
const ackDelay = 10 * time.Millisecond

// onMoved is the peer's word that it WRITEs into the buffer offered
// (next) from stream position at on: every byte before it arrived in
// ring, as it came on the same queue after them; c.mu held.
func (c *Conn) onMoved(at uint64) {
	if !c.moving || c.moved || at != c.prod {
		if c.err == nil {
			c.err = fmt.Errorf("smc: the peer moved to a buffer not offered (%v), or at %d with %d arrived: %w", c.moving, at, c.prod, errAborted)
		}
		return
	}
	c.moved, c.moveAt = true, at
}

// onMove is the peer's offer of a buffer to move to (moveMsg), applied
// by the keeper. It reports false for a message from another node than
// the peer's or without the connection's key.
func (c *Conn) onMove(from krcore.NodeID, m moveMsg) bool {
	c.mu.Lock()
	if from != c.peerNode || m.key != c.key {
		c.mu.Unlock()
		return false
	}
	c.moveTo = &m
	c.mu.Unlock()
	c.nudge()
	return true
}

// fail aborts the connection with err: waiters wake, reads drain what
// arrived and then fail with err, writes fail at once.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.signalSig(c.rxSig)
	c.signalSig(c.txSig)
	c.nudge()
	c.interrupt()
}

// shutWrite sends the peer flags saying this side writes no more; wrMu
// held.
func (c *Conn) shutWrite(flags byte) error {
	c.mu.Lock()
	skip := c.err != nil || (c.wrShut && flags == flagDoneWriting)
	c.wrShut = true
	c.mu.Unlock()
	if skip {
		return nil
	}
	return c.sendCDC(0, flags)
}

// closeSMC is Close over SMC: once a write in progress ends, the peer is
// told (after every byte written, on the same queue), the TCP connection
// closes, and the buffers are released once the peer writes no more: here
// if it said so already, else where its close flag is dispatched, or by
// the keeper (endNow).
func (c *Conn) closeSMC() {
	c.wrMu.Lock()
	c.shutWrite(flagDoneWriting | flagConnClosed)
	c.wrMu.Unlock()
	c.mu.Lock()
	c.localClosed = true
	c.mu.Unlock()
	switch c.endNow() {
	case waitPeer:
		c.mu.Lock()
		if !c.gone && c.lingerT == nil {
			c.lingerT = time.AfterFunc(linger, c.lingerOver)
		}
		c.mu.Unlock()
	case keeper:
		c.nudge()
	}
	c.tcp.Close()
}

// lingerOver ends linger after Close: the peer never said it writes no
// more; the keeper releases (and fences) the buffers.
func (c *Conn) lingerOver() {
	c.mu.Lock()
	c.lingered = true
	c.mu.Unlock()
	c.nudge()
}

// watchTCP reads the TCP connection, which carries nothing once SMC runs:
// its end (or a stray byte) means the peer closed or died. A peer whose
// close flag has not come by then (it travels over krcore and may come
// after the FIN) gets closeGrace for it, on a timer that takes it for
// dead (graceOver) unless the release stops it first: the keeper is not
// woken for it.
func (c *Conn) watchTCP() {
	defer c.node.wg.Done()
	var b [1]byte
	c.tcp.Read(b[:])
	c.mu.Lock()
	if !c.peerClosed && !c.gone {
		c.grace = time.AfterFunc(closeGrace, c.graceOver)
	}
	c.mu.Unlock()
}

// graceOver ends closeGrace after the TCP connection ended: a peer that
// has not closed by then is taken for dead.
func (c *Conn) graceOver() {
	c.mu.Lock()
	dead := !c.peerClosed && !c.gone
	c.mu.Unlock()
	if dead {
		c.fail(fmt.Errorf("smc: the peer's TCP connection ended without a close: %w", errAborted))
	}
}

// keep is the connection's housekeeper from its first task (nudge) until
// its buffers are released: it answers a peer blocked on window, tells a
// peer that closed that this side writes no more, and releases the
// buffers once the connection is closed and the peer writes no more (or
// linger passed, or the peer was taken for dead: graceOver) unless
// endNow did.
func (c *Conn) keep() {
	defer c.node.wg.Done()
	var sz sizer
	for {
		select {
		case <-sz.idle:
			sz.idle, sz.fired = nil, true
		case <-c.kick:
		}
		c.mu.Lock()
		if c.lingered {
			c.mu.Unlock()
			c.release()
			return
		}
		old := c.switchRing() // an idle reader's: the peer moved after its last byte
		ack := c.peerClosed && !c.wrShut && c.err == nil
		update := c.peerBlocked && c.err == nil && c.wantUpdate()
		resize, move := c.wantGrow(), c.moveTo
		if resize == 0 && sz.due(c) {
			resize = c.node.firstSize()
		}
		c.moveTo = nil
		if c.wrShut || c.err != nil {
			move = nil // no WRITE follows: the peer gives the buffer back at its end
		}
		done := c.localClosed && (c.peerDoneWriting || c.err != nil) && !c.lent
		if c.localClosed && c.lingerT == nil {
			c.lingerT = time.AfterFunc(linger, c.lingerOver)
		}
		c.mu.Unlock()
		giveBack(old)
		if done {
			c.release()
			return
		}
		if move != nil {
			c.applyMove(*move)
		}
		if resize != 0 {
			c.offerBuffer(resize)
		}
		if ack {
			c.wrMu.Lock()
			c.shutWrite(flagDoneWriting)
			c.wrMu.Unlock()
		} else if update {
			c.sendCDC(0, 0)
		}
	}
}

// release gives the connection's buffers, token and queue back, once the
// peer said it writes no more (its close flag comes after its last
// WRITE, on the same queue), or fenced when it did not. It does not wait for its
// last requests (the close's CDC, often): the staging buffer they read
// goes back when the last of them is credited (completed), by whoever
// pops it, so that the keeper ends at once instead of waiting for a
// round trip on the link and waking again. A completion that never comes
// (its queue closed) leaves the staging buffer out, held by its slab
// until the Node closes, so that no other connection's bytes reach this
// one's peer.
func (c *Conn) release() {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	c.releaseLocked()
}

// releaseLocked is release with qmu held.
func (c *Conn) releaseLocked() {
	c.mu.Lock()
	if !c.stageIdle() {
		c.lateStage, c.stage = c.stage, buffer{}
	}
	fence := !c.peerDoneWriting // aborted, or lingered past linger
	c.gone = true
	for _, t := range []*time.Timer{c.grace, c.lingerT, c.ackT} {
		if t != nil {
			t.Stop()
		}
	}
	c.mu.Unlock()
	c.released = true // no request uses the queue or the staging buffer after
	c.tcp.Close()
	c.releaseAs(fence)
}

// wantGrow is the size the receive buffer should grow to, or 0: it
// grows four times when its peer waited for window twice since the last
// offer (a stream the reader keeps up with fills any buffer, and only a
// larger one lets more than a buffer's worth cross per cursor round
// trip), up to the Node's maximum; c.mu held.
func (c *Conn) wantGrow() int {
	if c.blocks < 2 || !c.resizable() || len(c.ring) >= c.node.maxSize {
		return 0
	}
	size := min(len(c.ring)*4, c.node.maxSize)
	if size > lagBuffer && c.lags < 2 {
		return 0
	}
	return size
}

// lagBuffer is the receive buffer size past which a buffer grows only
// for a writer that said twice that it lags its window (flagWindowLag):
// a larger buffer costs memory (in one process a stream was slower on
// 4 MiB buffers than on 1 MiB, MEASUREMENTS.md), and pays only where the
// time the cursor takes to come back bounds the stream (through krcored,
// milliseconds).
const lagBuffer = 1 << 20

// lagWait is a wait for window long enough to say the writer lags its
// window: with 1 MiB buffers at load 6-10 a writer through krcored
// across processes waited 0.5-2.8 ms on average, an embedded one across
// processes 0.25-0.6 ms, one in a process with its reader 0.04-1 ms.
const lagWait = time.Millisecond

// resizable reports whether the receive buffer may move now (never if
// Options.BufferSize fixed it); c.mu held.
func (c *Conn) resizable() bool {
	return !c.moving && c.movable()
}

// movable reports whether the receive buffer may move once no move is in
// progress; c.mu held.
func (c *Conn) movable() bool {
	return c.opts.BufferSize == 0 && c.err == nil && !c.localClosed && !c.peerDoneWriting
}

// shrinkAfter is how long a grown receive buffer stays idle (nothing
// arrives, everything read) before it shrinks back to a new connection's
// size.
var shrinkAfter = time.Second

// sizer is the keeper's clock for shrinking an idle grown buffer.
type sizer struct {
	idle  <-chan time.Time
	fired bool
	prod  uint64 // the producer cursor when idle was armed
}

// due reports whether the receive buffer should shrink now: it is larger
// than a new connection's and nothing arrived, and everything was read,
// for shrinkAfter. It arms the clock for a grown buffer, and for one
// moving: the reader ends a move (chunk's switchRing) without waking the
// keeper, and a grow whose move ended after the keeper's last wake-up
// left the buffer grown for good (TestBufferShrinks, 1 in ~20 at nice 19
// beside a busy loop); c.mu held.
func (s *sizer) due(c *Conn) bool {
	fired := s.fired
	s.fired = false
	if c.moving && c.movable() {
		s.arm(c)
		return false
	}
	if len(c.ring) <= c.node.firstSize() || !c.resizable() {
		s.idle = nil
		return false
	}
	if fired && c.prod == s.prod && c.cons == c.prod {
		return true
	}
	s.arm(c)
	return false
}

// arm starts the clock unless it runs.
func (s *sizer) arm(c *Conn) {
	if s.idle == nil {
		s.idle, s.prod = time.After(shrinkAfter), c.prod
	}
}

// offerBuffer offers the peer a receive buffer of size bytes to move to
// (moveMsg), which it does when it likes. Without memory under the
// Node's bound the buffer stays as it is.
func (c *Conn) offerBuffer(size int) {
	b, err := c.node.rmbPool(c.peerAt, size, !c.server).get()
	c.mu.Lock()
	c.blocks, c.lags = 0, 0
	if err != nil {
		c.mu.Unlock()
		return
	}
	c.next, c.nextRing, c.moving = b, b.bytes(size), true
	counter := &c.node.stats.grows
	if size < len(c.ring) {
		counter = &c.node.stats.shrinks
	}
	c.mu.Unlock()
	counter.Add(1)
	m := moveMsg{token: c.pToken, key: c.pKey, off: uint32(b.off), size: uint32(size), name: b.s.name}
	c.qmu.Lock()
	c.pushCtl(func(slot []byte) []byte { return m.encode(slot) }) // a failure aborted the connection
	c.qmu.Unlock()
}

// applyMove moves this side's WRITEs to the buffer its peer offered,
// after every byte sent so far: flagMoved tells the peer on the same
// queue, behind them, so that it reads its old buffer to that point
// first. The staging ring grows with it. A buffer that cannot be found
// aborts the connection, whose peer waits for the move.
func (c *Conn) applyMove(m moveMsg) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	r, err := c.node.region(ctx, c.peerNode, m.name, true)
	if err == nil && (m.size < cdcLen || r.Len() < uint64(m.off)+uint64(m.size)) {
		c.node.putRegion(c.peerNode, m.name)
		err = fmt.Errorf("%d bytes at %d, in a region of %d: %w", m.size, m.off, r.Len(), krcore.ErrInvalid)
	}
	if err != nil {
		c.fail(fmt.Errorf("smc: the peer's new buffer %s: %w: %w", m.name, errAborted, err))
		return
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.released {
		c.node.putRegion(c.peerNode, m.name)
		return
	}
	k := regionKey{c.peerNode, m.name}
	if err := c.node.claimPeer(c, k, uint64(m.off), uint64(m.size)); err != nil {
		c.node.putRegion(c.peerNode, m.name)
		c.fail(fmt.Errorf("smc: the peer's new buffer: %w: %w", errAborted, err))
		return
	}
	c.fitStage(int(m.size))
	// No WRITE into the old buffer follows (qmu is held): its claim ends
	// before the peer, told below, can hand it to another connection.
	c.mu.Lock()
	old, oldOff := c.peerKey, c.peerOff
	c.mu.Unlock()
	c.node.unclaimPeer(c, old, oldOff)
	if err := c.pushCDC(0, flagMoved); err != nil {
		c.node.unclaimPeer(c, k, uint64(m.off))
		c.node.putRegion(c.peerNode, m.name)
		return
	}
	c.mu.Lock()
	c.peer, c.peerKey, c.peerOff, c.psize, c.pbase = r, k, uint64(m.off), int(m.size), c.sent
	c.mu.Unlock()
	c.node.putRegion(old.node, old.name)
	c.wake(c.txSig)
}

// fitStage moves to a staging ring of size bytes, the peer's buffer's,
// once no request reads the current one: a smaller ring makes a Write
// wait for WRITE completions before the window is full, a larger one
// holds memory an idle connection does not need. Without memory it
// stays as it is; qmu held.
func (c *Conn) fitStage(size int) {
	if c.stageRing() == size {
		return
	}
	if err := c.settle(c.stageIdle); err != nil {
		return
	}
	b, err := c.node.stagePool(size).get()
	if err != nil {
		return
	}
	c.mu.Lock()
	old := c.stage
	c.stage = b
	c.mu.Unlock()
	old.s.pool.put(old)
}
