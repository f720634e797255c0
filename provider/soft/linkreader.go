package soft

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// directRead is the payload size from which a payload is read from the
// socket straight into registered memory rather than through the buffer.
const directRead = 16 << 10

// readAhead bounds how much of what follows a large payload is read into
// the buffer with it: more would be copied out of the buffer again.
const readAhead = 4 << 10

// linkBufSize is a link's read buffer; it holds any frame smaller than
// directRead whole.
const linkBufSize = 256 << 10

var errInterrupted = errors.New("soft: link read interrupted")

// aLongTimeAgo is a read deadline that has passed: setting it wakes the
// goroutine blocked reading.
var aLongTimeAgo = time.Unix(1, 0)

// linkReader is the read side of a TCP link: its buffer and its place in
// the stream. Only the holder of the link's read role uses it.
//
// On Linux it reads in sessions: one RawConn.Read spans many frames, and
// frames that arrived whole are handled inside it. A session asks the
// poller to wait without trying a read first whenever the previous read
// came back short (the socket was empty then, and data arriving since
// marks it ready), which saves the read that would fail with EAGAIN before
// every wait; the end of the stream is the exception, so such a wait has a
// coarse deadline (boundSkip). A fresh session always reads first, because
// RawConn.Read forgets earlier readiness. Frames with a large payload are
// handled outside a session, reading the payload straight into registered
// memory. A session holds the connection's read lock, which is why killing
// a link shuts its connection down and its background reader closes it.
type linkReader struct {
	l    *tcpLink
	n    *Node
	conn net.Conn
	sock *rawSock // nil if conn is no socket (net.Pipe in tests)
	buf  []byte
	r, w int
	f    frame
	left uint32 // payload bytes of the frame being dispatched, unread
	big  bool   // the last frame's payload was large: read little ahead
	// drained: the last read got less than it asked for, so the socket
	// was empty and the next read may wait. Coalesced ACKs go out first.
	drained bool
	err     error // the link is broken (a read failed, a malformed frame)
	checkAt int64 // node.now() when boundSkip's read deadline passes; 0: none
	step    func(fd uintptr) bool

	// Set for the length of serve.
	stop     func() bool
	blocked  *atomic.Bool
	session  bool // inside a session: the socket must not be read from Read
	fresh    bool // no read in this session has found the socket empty yet
	pollRead bool // poll: the session's one read is still to come
	out      int  // why the session ended
}

// Why a session ended.
const (
	outStop = iota + 1 // stop said so
	outBig             // a frame with a large payload is next
	outErr             // rd.err
)

func newLinkReader(l *tcpLink, conn net.Conn) *linkReader {
	rd := &linkReader{l: l, n: l.node, conn: conn, sock: newRawSock(conn), buf: make([]byte, linkBufSize)}
	rd.step = rd.sessionStep
	return rd
}

// hasHeader reports whether a whole frame header is buffered.
func (rd *linkReader) hasHeader() bool { return rd.w-rd.r >= 4+headerLen }

// serve reads and handles frames until stop, asked whenever no whole frame
// is buffered, says to (nil), or the link fails (an error). blocked, if not
// nil, is set while the caller may wait for data: such a wait is
// interruptible by a past read deadline, after which stop is asked again.
func (rd *linkReader) serve(stop func() bool, blocked *atomic.Bool) error {
	rd.stop, rd.blocked = stop, blocked
	defer func() { rd.stop, rd.blocked = nil, nil }()
	for rd.err == nil {
		if rd.sock == nil {
			if !rd.hasHeader() {
				rd.setBlocked(true)
				if stop() {
					rd.setBlocked(false)
					return nil
				}
				err := rd.fillHeader(blocked != nil)
				rd.setBlocked(false)
				if err == errInterrupted {
					continue
				}
				if err != nil {
					return err
				}
			}
			if err := rd.decode(); err != nil {
				return err
			}
			rd.dispatch()
			continue
		}
		rd.out, rd.drained, rd.fresh, rd.session = 0, false, true, true
		err := rd.sock.session(rd.step)
		rd.session = false
		rd.setBlocked(false)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			rd.clearDeadline() // an interrupt, or boundSkip's deadline
			continue
		}
		switch rd.out {
		case outStop:
			return nil
		case outBig:
			rd.dispatch()
			// Ask stop between large frames too: dispatch reads the
			// next header ahead, so in a stream of them no session
			// would come to ask it, and a waiter whose completion is
			// long there (a receive consumed) would read on for as
			// long as the peer sends, starving its own application
			// of the chance to post the receives the stream needs.
			if rd.err == nil && stop() {
				return nil
			}
		}
	}
	return rd.err
}

// poll handles the frames that are here without waiting for any: those
// buffered whole, then those one read of the socket brings (a frame with
// a large payload is read to its end). It is how a goroutine polling a CQ
// reads a lent link. An error means the link failed.
func (rd *linkReader) poll() error {
	if rd.sock == nil {
		return nil // plain connections have no read that does not wait
	}
	rd.out, rd.drained, rd.fresh, rd.session, rd.pollRead = 0, false, true, true, true
	rd.stop = stopNow
	err := rd.sock.session(rd.step)
	rd.stop, rd.session = nil, false
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	if err != nil {
		rd.clearDeadline()
	}
	if rd.out == outBig {
		rd.dispatch()
	}
	return rd.err
}

// stopNow is poll's stop: it asks for one read, and no wait.
func stopNow() bool { return true }

func (rd *linkReader) setBlocked(b bool) {
	if rd.blocked != nil {
		rd.blocked.Swap(b) // ordered before stop's loads, even under the race detector (golang/go#58020)
	}
}

// sessionStep is the body of a session, called by RawConn.Read with the
// socket: it reports true to end the session, false to wait for data.
func (rd *linkReader) sessionStep(fd uintptr) bool {
	rd.setBlocked(false)
	for {
		// Handle every frame that is here whole.
		for rd.hasHeader() {
			if rd.decode() != nil {
				rd.out = outErr
				return true
			}
			if rd.f.plen >= directRead {
				rd.out = outBig
				return true
			}
			if uint32(rd.w-rd.r-4-headerLen) < rd.f.plen {
				break
			}
			rd.dispatch()
			if rd.err != nil {
				rd.out = outErr
				return true
			}
		}
		rd.setBlocked(true)
		if rd.stop() && !rd.pollRead {
			rd.out = outStop
			return true
		}
		if rd.pollRead {
			// poll: one read, whatever it brings, and no wait.
			rd.pollRead = false
			b := rd.space()
			n, err := rd.sock.readFd(fd, b)
			switch {
			case err == errAgain:
				rd.out = outStop
				return true
			case err != nil:
				rd.err = err
				rd.out = outErr
				return true
			}
			rd.drained = n < len(b)
			rd.w += n
			continue
		}
		if rd.drained {
			rd.drained = false
			rd.l.flushAcks()
			if rd.boundSkip() && rd.stop() {
				// boundSkip's deadline may have replaced an
				// interrupt that came after stop was asked.
				rd.out = outStop
				return true
			}
			return false // wait for data without trying first
		}
		b := rd.space()
		n, err := rd.sock.readFd(fd, b)
		switch {
		case err == errAgain:
			rd.fresh = false
			rd.l.flushAcks()
			return false
		case err != nil:
			rd.err = err
			rd.out = outErr
			return true
		}
		rd.setBlocked(false)
		// A short read emptied the socket, so the next read may wait for
		// new data first, unless it is the session's first: an end of
		// stream (or error) that came before the session began was
		// signalled before RawConn.Read cleared readiness, and a read
		// returning data does not report it.
		rd.drained = n < len(b) && !rd.fresh
		rd.fresh = false
		rd.w += n
	}
}

// skipCheck bounds a wait that skipped its read (see boundSkip).
const skipCheck = time.Second

// boundSkip makes sure a wait that did not read first ends within
// skipCheck. A short read means the socket had no more data, but not that
// it had no end of stream: epoll reports arrivals edge-triggered, so a FIN
// that followed the data before the poller looked is folded into the one
// readiness event the data consumed, and no further event comes. The
// deadline, set at most every skipCheck/2, is cheap; when it passes, a read
// settles it.
// It reports whether it set the deadline.
func (rd *linkReader) boundSkip() bool {
	now := rd.n.now()
	if rd.checkAt-now >= int64(skipCheck/2) {
		return false
	}
	rd.checkAt = now + int64(skipCheck)
	rd.conn.SetReadDeadline(time.Now().Add(skipCheck))
	return true
}

// clearDeadline clears the read deadline after it passed: an interrupt, or
// boundSkip's.
func (rd *linkReader) clearDeadline() {
	rd.conn.SetReadDeadline(time.Time{})
	rd.checkAt = 0
}

// space makes room in the buffer for the next read, keeping what is
// buffered, and returns where to read into.
func (rd *linkReader) space() []byte {
	if rd.r == rd.w {
		rd.r, rd.w = 0, 0
	} else if need := rd.need(); len(rd.buf)-rd.r < need {
		rd.w = copy(rd.buf, rd.buf[rd.r:rd.w])
		rd.r = 0
	}
	end := len(rd.buf)
	if rd.big {
		// Large frames are streaming: read little beyond what the next
		// frame needs, so their payloads go straight to memory.
		end = min(end, max(rd.w+readAhead, rd.r+rd.need()))
	}
	return rd.buf[rd.w:end]
}

// need is how many buffered bytes the next frame needs to be handled.
func (rd *linkReader) need() int {
	if !rd.hasHeader() {
		return max(4+headerLen, readAhead)
	}
	return 4 + headerLen + int(rd.f.plen)
}

// decode decodes the buffered frame header into rd.f.
func (rd *linkReader) decode() error {
	f := &rd.f
	if err := decodeHeader(rd.buf[rd.r:rd.r+4+headerLen], f); err != nil {
		rd.err = err
		return err
	}
	if f.typ != frameRequest && f.typ != frameResponse {
		rd.err = errFrame // a malformed frame ends the link
		return errFrame
	}
	return nil
}

// dispatch handles the decoded frame, whose header is buffered.
func (rd *linkReader) dispatch() {
	f := &rd.f
	rd.r += 4 + headerLen
	rd.left = f.plen
	rd.big = f.plen >= directRead
	rd.n.receive(rd.l, f, rd)
	for rd.left > 0 && rd.err == nil {
		if rd.r == rd.w && rd.fill() != nil {
			break
		}
		k := min(uint32(rd.w-rd.r), rd.left)
		rd.r += int(k)
		rd.left -= k
	}
}

// Read reads the payload of the frame being dispatched.
func (rd *linkReader) Read(p []byte) (int, error) {
	if rd.err != nil {
		return 0, rd.err
	}
	if rd.left == 0 {
		return 0, io.EOF
	}
	if uint32(len(p)) > rd.left {
		p = p[:rd.left]
	}
	if rd.r == rd.w {
		if len(p) >= directRead && !rd.session {
			return rd.readDirect(p)
		}
		if err := rd.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, rd.buf[rd.r:rd.w])
	rd.r += n
	rd.left -= uint32(n)
	return n, nil
}

// ready waits, reading nothing, until Read has a byte of the payload at
// least without waiting (see payloadStream): one is buffered, or the
// socket has data (a raw socket), or the buffer is filled (a plain
// connection). A frame handled in a session is buffered whole.
func (rd *linkReader) ready() error {
	if rd.err != nil || rd.left == 0 || rd.r < rd.w || rd.session {
		return rd.err
	}
	if rd.sock == nil {
		return rd.fill()
	}
	if rd.drained {
		rd.l.flushAcks()
	}
	for {
		err := rd.sock.waitReadable()
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			rd.err = err
			return err
		}
		rd.clearDeadline() // an interrupt: a frame is being read
	}
}

// readDirect reads payload into p from the socket, and a little of what
// follows into the empty buffer.
func (rd *linkReader) readDirect(p []byte) (int, error) {
	rd.r, rd.w = 0, 0
	var ahead []byte
	if rd.sock != nil && uint32(len(p)) == rd.left {
		ahead = rd.buf[:readAhead]
	}
	n, err := rd.read(p, ahead)
	if err != nil {
		rd.err = err
		return 0, err
	}
	if n > len(p) {
		rd.w = n - len(p)
		n = len(p)
	}
	rd.left -= uint32(n)
	return n, nil
}

// fill refills the empty buffer in the middle of a frame.
func (rd *linkReader) fill() error {
	if rd.session {
		// A bug: a frame handled in a session is buffered whole, and
		// reading the socket here would deadlock on it.
		rd.err = errFrame
		return rd.err
	}
	rd.r, rd.w = 0, 0
	end := len(rd.buf)
	if rd.big {
		end = min(end, int(rd.left)+readAhead)
	}
	n, err := rd.read(rd.buf[:end], nil)
	if err != nil {
		rd.err = err
		return err
	}
	rd.w = n
	return nil
}

// fillHeader reads until a whole frame header is buffered, without
// sessions. If intr, an interrupt returns errInterrupted.
func (rd *linkReader) fillHeader(intr bool) error {
	for !rd.hasHeader() {
		b := rd.space()
		n, err := rd.readOnce(b, nil)
		rd.w += n
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			rd.err = err
			return err
		}
		rd.clearDeadline()
		if intr {
			return errInterrupted
		}
	}
	return nil
}

// read reads at least one byte into a and then b (b only with raw reads),
// outside a session. Interrupts are cleared and ignored: a frame is being
// read.
func (rd *linkReader) read(a, b []byte) (int, error) {
	for {
		n, err := rd.readOnce(a, b)
		if n > 0 || err == nil {
			return n, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, err
		}
		rd.clearDeadline()
	}
}

// readOnce is one blocking read outside a session.
func (rd *linkReader) readOnce(a, b []byte) (int, error) {
	if rd.drained {
		rd.l.flushAcks()
	}
	if rd.sock != nil {
		n, err := rd.sock.readv(a, b)
		rd.drained = n < len(a)+len(b)
		return n, err
	}
	n, err := rd.conn.Read(a)
	rd.drained = true
	if n > 0 {
		err = nil
	}
	return n, err
}
