package kernellink

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"github.com/krcore/krcore/smc/internal/smcr"
	"github.com/krcore/krcore/verbs"
)

// Conn is one connection on a link group: our RMB the kernel writes
// into, a send buffer of the peer's RMB's size our WRITEs go from, and
// the cursors of both, in bytes since the connection began.
type Conn struct {
	g     *Group
	token uint32 // our alert token: the kernel's CDC messages name it
	rmb   verbs.MR
	snd   verbs.MR
	// Peer is the kernel's CLC confirm (we serve) or accept (we dial).
	Peer *smcr.AcceptConfirm

	txMu sync.Mutex // one CDC sender at a time, so sequence numbers go out in order
	// The sender's scratch, under txMu, so that a Write allocates
	// nothing: the CDC message's bytes and the WRITEs of one writeSome
	// (the provider copies both when they are posted).
	cdcBuf [smcr.LLCLen]byte
	wrs    [wrsPerSlot]verbs.SendWR
	sges   [wrsPerSlot]verbs.SGE

	mu         sync.Mutex
	changed    chan struct{} // closed and replaced on every change a waiter may want
	rxProd     uint64        // the peer's bytes in our RMB
	rxCons     uint64        // what we read of them
	consSent   uint64        // the consumer cursor the peer last got
	txProd     uint64        // our bytes in the peer's RMB
	txFin      uint64        // of those, the ones whose WRITEs completed
	txPeerCons uint64        // what the peer read of them
	seq        uint16
	peerWaits  bool // the peer said it is blocked or asked for our cursor
	weWait     bool // we told the peer we are blocked
	peerDone   bool // the peer shut down writing or closed
	peerClosed bool
	shut       bool // CloseWrite or Close
	closed     bool
	err        error // abort: the peer's or the group's
	freed      bool
}

// newConn makes a connection's RMB on g and registers it under a new
// token, so the kernel's first CDC finds it.
func (g *Group) newConn() (*Conn, error) {
	rmb, err := g.region(rmbSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return nil, err
	}
	c := &Conn{g: g, rmb: rmb, changed: make(chan struct{})}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		g.unregionLocked(rmb)
		return nil, g.err
	}
	g.nextToken++
	c.token = g.nextToken
	g.conns[c.token] = c
	return c, nil
}

// message is the accept or confirm naming this connection's buffer on
// the group's QP.
func (c *Conn) message(typ byte, firstContact bool, eid smcr.EID) *smcr.AcceptConfirm {
	ep := c.g.local()
	m := &smcr.AcceptConfirm{Type: typ, Version: 2, FirstContact: firstContact,
		PeerID: c.g.ep.cfg.SystemID, GID: [16]byte(ep.GID), QPN: ep.QPN,
		RMBRkey: c.rmb.RKey(), RMBEIdx: 1, AlertToken: c.token,
		RMBESize: rmbSizeComp, QPMTU: mtuEnum, RMBAddr: c.rmb.Addr(), PSN: ep.PSN & 0xffffff, EID: eid}
	copy(m.MAC[:], c.g.ep.cfg.MAC)
	return m
}

// serverHandshake sends our accept for the proposal p and reads the
// kernel's confirm; on first contact the group's QP then goes up.
func (c *Conn) serverHandshake(ctx context.Context, tc net.Conn, p *smcr.Proposal, first bool) error {
	a := c.message(smcr.TypeAccept, first, c.g.ep.cfg.EID)
	if first {
		a.FCE = &smcr.FirstContactExt{V2Direct: true, OSType: smcr.OSLinux, Release: 1,
			Hostname: [32]byte(smcr.MakeEID(c.g.ep.cfg.Hostname)), MaxConns: 255, MaxLinks: 1}
	}
	b, err := a.Append(nil)
	if err != nil {
		return err
	}
	if err := writeCLC(tc, b, "accept"); err != nil {
		return err
	}
	if c.Peer, err = readCLC(tc, smcr.TypeConfirm); err != nil {
		return err
	}
	if first {
		if err := c.g.up(c.Peer); err != nil {
			return err
		}
	}
	return c.setupSend()
}

// clientHandshake answers the kernel's accept a with our confirm; on
// first contact the group's QP goes up first, and the confirm echoes the
// accept's first-contact limits (the kernel checks them).
func (c *Conn) clientHandshake(ctx context.Context, tc net.Conn, a *smcr.AcceptConfirm) error {
	c.Peer = a
	if a.FirstContact {
		if err := c.g.up(a); err != nil {
			return err
		}
	}
	if err := c.setupSend(); err != nil {
		return err
	}
	m := c.message(smcr.TypeConfirm, a.FirstContact, a.EID)
	m.QPMTU = min(a.QPMTU, mtuEnum)
	if a.FirstContact {
		f := *a.FCE
		f.OSType, f.Hostname = smcr.OSLinux, [32]byte(smcr.MakeEID(c.g.ep.cfg.Hostname))
		m.FCE, m.GIDs = &f, [][16]byte{m.GID}
	}
	b, err := m.Append(nil)
	if err != nil {
		return err
	}
	return writeCLC(tc, b, "confirm")
}

// setupSend registers the send buffer, the size of the peer's RMB, so
// both rings wrap at the same offsets.
func (c *Conn) setupSend() error {
	var err error
	c.snd, err = c.g.region(c.peerSize(), verbs.AccessLocalWrite)
	return err
}

func (c *Conn) peerSize() int { return 16384 << c.Peer.RMBESize }

// broadcast wakes the waiters; c.mu is held.
func (c *Conn) broadcast() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// await releases c.mu until a change or cancel, and takes it again.
func (c *Conn) await(cancel <-chan struct{}) error {
	ch := c.changed
	c.mu.Unlock()
	defer c.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-cancel:
		return os.ErrDeadlineExceeded
	}
}

// Read reads what the peer wrote, waiting until there is some, the peer
// closed (io.EOF once all is read), or cancel is closed
// (os.ErrDeadlineExceeded).
func (c *Conn) Read(p []byte, cancel <-chan struct{}) (int, error) {
	c.mu.Lock()
	if c.closed { // its receive buffer may be unmapped already (maybeFree)
		c.mu.Unlock()
		return 0, ErrClosed
	}
	for c.rxProd == c.rxCons {
		if err := c.readErr(); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if len(p) == 0 {
			break
		}
		if err := c.await(cancel); err != nil {
			c.mu.Unlock()
			return 0, err
		}
	}
	n := 0
	for n < len(p) && c.rxCons < c.rxProd {
		off := int(c.rxCons % rmbSize)
		k := copy(p[n:], c.rmb.Bytes()[off:min(rmbSize, off+int(c.rxProd-c.rxCons))])
		n += k
		c.rxCons += uint64(k)
	}
	c.mu.Unlock()
	c.update(false)
	return n, nil
}

// Write writes p into the peer's RMB, waiting for room as the peer reads.
func (c *Conn) Write(p []byte, cancel <-chan struct{}) (int, error) {
	done := 0
	for done < len(p) {
		n, err := c.writeSome(p[done:], cancel)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// room is how much we can write now: the peer's RMB's free space, and
// our send buffer's (bytes stay there until their WRITEs completed).
func (c *Conn) room() int {
	used := c.txProd - min(c.txFin, c.txPeerCons)
	return c.peerSize() - int(used)
}

// writeSome writes as much of p as there is room for, after waiting for
// some: a copy into the send buffer, WRITEs to the same offsets of the
// peer's RMB (two where the ring wraps), and the CDC message behind them.
// The wait holds no sender lock: a reader must be able to return our
// consumer cursor meanwhile, or two peers writing into each other's full
// buffers would wait for each other.
func (c *Conn) writeSome(p []byte, cancel <-chan struct{}) (int, error) {
	if err := c.awaitRoom(cancel); err != nil {
		return 0, err
	}
	c.txMu.Lock()
	defer c.txMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	size := c.peerSize()
	n := min(len(p), c.room()) // 0 when another writer took the room: Write waits again
	wrs := c.wrs[:0]
	for done := 0; done < n; {
		off := int((c.txProd + uint64(done)) % uint64(size))
		k := copy(c.snd.Bytes()[off:min(size, off+n-done)], p[done:n])
		i := len(wrs)
		c.sges[i] = verbs.SGEOf(c.snd, off, k)
		wrs = append(wrs, verbs.SendWR{ID: 1 << 32, Op: verbs.OpWrite, SGL: c.sges[i : i+1 : i+1],
			RemoteAddr: c.Peer.RMBAddr + uint64(off), RKey: c.Peer.RMBRkey})
		done += k
	}
	if n == 0 {
		return 0, nil
	}
	c.txProd += uint64(n)
	c.weWait = false
	if err := c.sendCDCLocked(0, 0, wrs...); err != nil {
		return 0, err
	}
	return n, nil
}

// awaitRoom waits until the peer's RMB has room, telling the peer once
// that we wait, so that it returns its cursor however little it read
// (the kernel's rule).
func (c *Conn) awaitRoom(cancel <-chan struct{}) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.room() == 0 {
		if err := c.writeErr(); err != nil {
			return err
		}
		if c.weWait {
			if err := c.await(cancel); err != nil {
				return err
			}
			continue
		}
		c.weWait = true
		c.mu.Unlock()
		c.txMu.Lock()
		c.mu.Lock()
		err := c.sendCDCLocked(smcr.CDCWriteBlocked, 0)
		c.txMu.Unlock()
		if err != nil {
			return err
		}
	}
	return c.writeErr()
}

// sendCDCLocked sends our cursors and flags after the WRITEs wrs; c.mu
// and c.txMu are held (c.mu is released while a send slot is awaited).
func (c *Conn) sendCDCLocked(prodFlags, connFlags uint8, wrs ...verbs.SendWR) error {
	c.seq++
	m := &smcr.CDC{Seq: c.seq, Token: c.Peer.AlertToken,
		Prod: cursorOf(c.txProd, c.peerSize()), Cons: cursorOf(c.rxCons, rmbSize),
		ProdFlags: prodFlags, ConnFlags: connFlags}
	c.consSent = c.rxCons
	u := slotUse{conn: c, fin: c.txProd}
	c.mu.Unlock()
	defer c.mu.Lock()
	return c.g.send(context.Background(), m.Append(c.cdcBuf[:0]), u, wrs...)
}

// update returns our consumer cursor when the kernel's rule
// (smc_tx_consumer_update) says: more than a tenth of the RMB read since
// the last one, and the peer either blocked or asking, or left with at
// most half its room. force sends whatever was read.
func (c *Conn) update(force bool) {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.updateDue(force) {
		c.sendCDCLocked(0, 0)
	}
}

func (c *Conn) updateDue(force bool) bool {
	if c.rxCons == c.consSent || c.peerClosed || c.err != nil || c.closed {
		return false
	}
	senderFree := rmbSize - (c.rxProd - c.consSent)
	return force || c.rxCons-c.consSent > rmbSize/10 && (c.peerWaits || senderFree <= rmbSize/2)
}

// readErr is why a read ends with nothing to read, or nil to wait.
func (c *Conn) readErr() error {
	switch {
	case c.err != nil:
		return c.err
	case c.closed:
		return ErrClosed
	case c.peerDone:
		return io.EOF
	}
	return nil
}

// writeErr is why a write cannot go on, or nil.
func (c *Conn) writeErr() error {
	switch {
	case c.err != nil:
		return c.err
	case c.shut:
		return ErrWriteShut
	case c.peerClosed:
		return ErrPeerClosed
	}
	return nil
}

// onCDC applies the peer's CDC message (on the poller).
func (c *Conn) onCDC(m *smcr.CDC) {
	c.mu.Lock()
	c.rxProd = fromCursor(m.Prod, rmbSize, c.rxProd)
	c.txPeerCons = fromCursor(m.Cons, c.peerSize(), c.txPeerCons)
	c.peerWaits = m.ProdFlags&(smcr.CDCWriteBlocked|smcr.CDCCursorRequest) != 0
	if m.ConnFlags&(smcr.CDCPeerDoneWriting|smcr.CDCPeerConnClosed|smcr.CDCPeerConnAbort) != 0 {
		c.peerDone = true
	}
	if m.ConnFlags&(smcr.CDCPeerConnClosed|smcr.CDCPeerConnAbort) != 0 {
		c.peerClosed = true
	}
	if m.ConnFlags&smcr.CDCPeerConnAbort != 0 && c.err == nil {
		c.err = fmt.Errorf("kernellink: the peer aborted: %w", ErrAborted)
	}
	due := c.peerWaits && c.updateDue(false)
	c.broadcast()
	c.mu.Unlock()
	if due && c.txMu.TryLock() {
		// The poller cannot wait for the sender's lock: a sender holding
		// it sends our cursor in its own CDC anyway.
		c.mu.Lock()
		if c.updateDue(false) {
			c.seq++
			m := &smcr.CDC{Seq: c.seq, Token: c.Peer.AlertToken,
				Prod: cursorOf(c.txProd, c.peerSize()), Cons: cursorOf(c.rxCons, rmbSize)}
			c.consSent = c.rxCons
			c.g.trySend(m.Append(nil))
		}
		c.mu.Unlock()
		c.txMu.Unlock()
	}
	c.maybeFree()
}

// sent records that the WRITEs up to fin completed (on the poller).
func (c *Conn) sent(fin uint64) {
	c.mu.Lock()
	if fin > c.txFin {
		c.txFin = fin
		c.broadcast()
	}
	c.mu.Unlock()
	c.maybeFree()
}

// abort ends the connection with err (its group ended).
func (c *Conn) abort(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	c.broadcast()
	c.mu.Unlock()
	c.maybeFree()
}

// CloseWrite sends the done-writing flag after every byte written: the
// peer reads them, then EOF.
func (c *Conn) CloseWrite() error {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.shut || c.err != nil {
		return nil
	}
	c.shut = true
	c.broadcast()
	return c.sendCDCLocked(0, smcr.CDCPeerDoneWriting)
}

// Close sends the closed flag (after every byte written) unless the
// connection aborted; its buffers go once the peer closed too (until
// then the kernel may still write into our RMB) and our WRITEs
// completed. Waiting reads and writes fail with ErrClosed.
func (c *Conn) Close() error {
	c.txMu.Lock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.txMu.Unlock()
		return ErrClosed
	}
	c.closed, c.shut = true, true
	c.broadcast()
	var err error
	if c.err == nil {
		err = c.sendCDCLocked(0, smcr.CDCPeerConnClosed)
	}
	c.mu.Unlock()
	c.txMu.Unlock()
	c.maybeFree()
	return err
}

// maybeFree frees the connection's buffers once nothing may touch them:
// closed here, and closed by the peer (or aborted), and our WRITEs done
// (or the group gone).
func (c *Conn) maybeFree() {
	c.mu.Lock()
	ok := !c.freed && c.closed && (c.peerClosed || c.err != nil) && (c.txFin == c.txProd || c.err != nil)
	if ok {
		c.freed = true
	}
	c.mu.Unlock()
	if ok {
		c.drop()
	}
}

// drop takes the connection off its group and frees its buffers; the
// group lingers once it has none.
func (c *Conn) drop() {
	g := c.g
	g.mu.Lock()
	delete(g.conns, c.token)
	g.unregionLocked(c.rmb)
	if c.snd != nil {
		g.unregionLocked(c.snd)
	}
	g.mu.Unlock()
	g.idleCheck()
}

// unregionLocked deregisters and frees a region of g's (if g has not
// freed it already); g.mu is held.
func (g *Group) unregionLocked(mr verbs.MR) {
	for i, m := range g.mrs {
		if m == mr {
			mr.Close()
			g.mrs = append(g.mrs[:i], g.mrs[i+1:]...)
			g.mem[i].Close()
			g.mem = append(g.mem[:i], g.mem[i+1:]...)
			return
		}
	}
}

func cursorOf(n uint64, size int) smcr.Cursor {
	return smcr.Cursor{Wrap: uint16(n / uint64(size)), Count: uint32(n % uint64(size))}
}

// fromCursor maps a cursor of a ring of size bytes back to a byte count,
// the one at or after near (cursors only move forward) within one cycle
// of the 16-bit wrap counter.
func fromCursor(c smcr.Cursor, size int, near uint64) uint64 {
	period := uint64(size) << 16
	v := near - near%period + uint64(c.Wrap)*uint64(size) + uint64(c.Count)
	if v < near {
		v += period
	}
	return v
}
