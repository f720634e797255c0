//go:build linux

package wire

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/krcore/krcore/verbs"
	"golang.org/x/sys/unix"
)

// DefaultSocket is where krcored listens, and a client attaches, by
// default: $XDG_RUNTIME_DIR/krcored.sock, or /run/krcored.sock.
func DefaultSocket() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "krcored.sock")
	}
	return "/run/krcored.sock"
}

// maxFDs bounds the descriptors one message may carry.
const maxFDs = 5

// Send writes m and its descriptors on c. The descriptors stay the caller's.
// A message longer than MaxMessage is refused (verbs.ErrInvalid), not sent:
// the receiver would read it truncated, as malformed, and never answer.
func Send(c *net.UnixConn, m *Msg) error {
	if n := HeaderLen + len(m.b); n > MaxMessage {
		return fmt.Errorf("wire: op %d: message of %d bytes, at most %d: %w", m.Op, n, MaxMessage, verbs.ErrInvalid)
	}
	var oob []byte
	if len(m.FDs) > 0 {
		oob = unix.UnixRights(m.FDs...)
	}
	if _, _, err := c.WriteMsgUnix(m.Bytes(), oob, nil); err != nil {
		return fmt.Errorf("wire: send op %d: %w", m.Op, err)
	}
	return nil
}

// Recv reads one message from c. The descriptors it carries become the
// caller's, even when it returns an error with a message. A loop that
// reads one connection keeps a Receiver instead: Recv takes a buffer of
// MaxMessage bytes for every message.
func Recv(c *net.UnixConn) (*Msg, error) {
	r := NewReceiver(c)
	defer r.Release()
	return r.Recv()
}

// Receiver reads the messages of one connection, one goroutine at a time,
// through buffers it keeps: a message then costs an allocation of its own
// length. A fresh MaxMessage buffer per message (64 KiB, zeroed, and
// garbage after) was most of a small control call's work on either side.
// The buffer comes from a pool and goes back with Release: krcored makes a
// Receiver per client, and a client per newcomer, whose 64 KiB were most
// of what a newcomer allocated in krcored.
type Receiver struct {
	c   *net.UnixConn
	b   *[MaxMessage]byte
	oob []byte
}

// recvBufs are Receivers' message buffers.
var recvBufs = sync.Pool{New: func() any { return new([MaxMessage]byte) }}

// NewReceiver is a Receiver of c's messages.
func NewReceiver(c *net.UnixConn) *Receiver {
	return &Receiver{c: c, b: recvBufs.Get().(*[MaxMessage]byte), oob: make([]byte, unix.CmsgSpace(maxFDs*4))}
}

// Release gives the Receiver's buffer back; the Receiver is not used
// again.
func (r *Receiver) Release() {
	if r.b != nil {
		recvBufs.Put(r.b)
		r.b = nil
	}
}

// Recv reads the next message, as Recv does; the message holds a copy of
// its bytes, not the Receiver's buffer.
func (r *Receiver) Recv() (*Msg, error) {
	n, oobn, flags, _, err := r.c.ReadMsgUnix(r.b[:], r.oob)
	if err != nil {
		return nil, err
	}
	fds, ferr := parseRights(r.oob[:oobn])
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll(fds)
		return nil, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	if ferr != nil {
		closeAll(fds)
		return nil, ferr
	}
	if n == 0 {
		closeAll(fds)
		return nil, net.ErrClosed // SOCK_SEQPACKET: a zero-length read is the peer's close
	}
	m, err := Parse(bytes.Clone(r.b[:n]), fds)
	if err != nil {
		closeAll(fds)
	}
	return m, err
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	cmsgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %w", ErrMalformed, err)
	}
	var fds []int
	for i := range cmsgs {
		got, err := unix.ParseUnixRights(&cmsgs[i])
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// CloseFDs closes m's descriptors that the receiver did not keep.
func (m *Msg) CloseFDs() { closeAll(m.FDs); m.FDs = nil }

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd < 0 {
			continue // taken by its handler
		}
		unix.Close(fd)
	}
}
