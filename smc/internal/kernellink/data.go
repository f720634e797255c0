package kernellink

import (
	"context"
	"errors"
	"fmt"

	"github.com/krcore/krcore/smc/internal/smcr"
	"github.com/krcore/krcore/verbs"
)

// ErrPeerClosed is returned once the kernel peer closed the connection
// and every byte it wrote was consumed.
var ErrPeerClosed = errors.New("kernellink: the peer closed the connection")

// stream is one connection's data path state, in bytes since the
// connection began: what the peer produced into our RMB and what we
// consumed of it, what we produced into the peer's RMB and what it
// consumed (from its CDC messages).
type stream struct {
	rxProd, rxCons     uint64
	txProd, txPeerCons uint64
	seq                uint16
	peerClosed         bool
	peerAborted        bool // the peer aborted: its unread bytes are dropped
	blocked            bool // we told the peer we wait for room
}

func (l *Link) peerSize() int { return 16384 << l.Peer.RMBESize }

// Echo serves the connection as an echo server until the peer closes it:
// each CDC message announcing bytes in our RMB is answered by RDMA WRITEs
// of those bytes into the peer's RMB (straight from ours) and a CDC
// message with our producer and consumer cursors, as the kernel's own
// data path does. It returns the bytes echoed; when the peer closed, the
// error is ErrPeerClosed, after our own close CDC was sent (at once, with
// nothing more sent, when the peer aborted).
func (l *Link) Echo(ctx context.Context) (int64, error) {
	s := &l.s
	for {
		if s.peerAborted {
			return int64(s.txProd), fmt.Errorf("%w: aborted", ErrPeerClosed)
		}
		if n := l.echoable(s); n > 0 {
			if err := l.echo(ctx, s, n); err != nil {
				return int64(s.txProd), err
			}
			continue
		}
		if s.peerClosed && s.rxCons == s.rxProd {
			err := l.sendCDC(ctx, s, 0, smcr.CDCPeerConnClosed)
			return int64(s.txProd), errors.Join(ErrPeerClosed, err)
		}
		if s.rxCons < s.rxProd && !s.blocked {
			// The peer's RMB is full: say so, so that it returns its
			// consumer cursor however little it read (the kernel's rule).
			s.blocked = true
			if err := l.sendCDC(ctx, s, smcr.CDCWriteBlocked, 0); err != nil {
				return int64(s.txProd), err
			}
		}
		if err := l.next(ctx, s); err != nil {
			return int64(s.txProd), err
		}
	}
}

// echoable is how many bytes can go back now: received and not yet
// echoed, bounded by the room the peer's RMB has.
func (l *Link) echoable(s *stream) uint64 {
	room := uint64(l.peerSize()) - (s.txProd - s.txPeerCons)
	return min(s.rxProd-s.rxCons, room)
}

// echo writes n bytes from our RMB at the consumer cursor back to the
// peer: they are consumed once the WRITEs are posted, since the CDC
// message that frees them for the peer follows them on the send queue.
func (l *Link) echo(ctx context.Context, s *stream, n uint64) error {
	start := s.rxCons
	s.rxCons += n
	return l.write(ctx, s, l.rmb, start, n)
}

// write RDMA WRITEs n bytes of src, from offset start (taken modulo its
// length: our RMB is a ring), into the peer's RMB at our producer cursor,
// split where either ring wraps, then sends the CDC message that makes
// them visible.
func (l *Link) write(ctx context.Context, s *stream, src verbs.MR, start, n uint64) error {
	var wrs []verbs.SendWR
	for done := uint64(0); done < n; {
		from := int((start + done) % uint64(src.Len()))
		dst := int((s.txProd + done) % uint64(l.peerSize()))
		k := min(int(n-done), src.Len()-from, l.peerSize()-dst)
		wrs = append(wrs, verbs.SendWR{ID: 2 << 32, Op: verbs.OpWrite,
			SGL:        []verbs.SGE{verbs.SGEOf(src, from, k)},
			RemoteAddr: l.Peer.RMBAddr + uint64(dst), RKey: l.Peer.RMBRkey})
		done += uint64(k)
	}
	if _, err := l.qp.PostSend(wrs); err != nil {
		return fmt.Errorf("kernellink: posting RDMA WRITEs: %w", err)
	}
	s.txProd += n
	s.blocked = false
	return l.sendCDC(ctx, s, 0, 0)
}

// sendCDC sends our cursors and flags to the peer.
func (l *Link) sendCDC(ctx context.Context, s *stream, prodFlags, connFlags uint8) error {
	s.seq++
	m := &smcr.CDC{Seq: s.seq, Token: l.Peer.AlertToken,
		Prod:      cursorOf(s.txProd, l.peerSize()),
		Cons:      cursorOf(s.rxCons, rmbSize),
		ProdFlags: prodFlags, ConnFlags: connFlags}
	return l.send(ctx, m.Append(nil))
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

// next waits for one message from the peer and applies it: a CDC
// message moves the cursors, TEST_LINK is answered, other LLC messages
// are dropped.
func (l *Link) next(ctx context.Context, s *stream) error {
	b, err := l.recv(ctx)
	if err != nil {
		return err
	}
	if len(b) > 0 && b[0] == smcr.CDCType {
		m, err := smcr.DecodeCDC(b)
		if err != nil {
			return err
		}
		s.rxProd = fromCursor(m.Prod, rmbSize, s.rxProd)
		s.txPeerCons = fromCursor(m.Cons, l.peerSize(), s.txPeerCons)
		if m.ConnFlags&(smcr.CDCPeerConnClosed|smcr.CDCPeerConnAbort|smcr.CDCPeerDoneWriting) != 0 {
			s.peerClosed = true
		}
		s.peerAborted = s.peerAborted || m.ConnFlags&smcr.CDCPeerConnAbort != 0
		return nil
	}
	msg, err := smcr.DecodeLLC(b)
	if errors.Is(err, smcr.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return err
	}
	if t, ok := msg.(*smcr.TestLink); ok && t.Flags&smcr.LLCFlagResp == 0 {
		t.Flags |= smcr.LLCFlagResp
		return l.send(ctx, t.Append(nil))
	}
	return nil
}
