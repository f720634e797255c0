// Package control is krbench's out-of-band control protocol: what perftest
// exchanges over TCP beside the RDMA traffic (QP endpoints, MR address, rkey
// and length, the test parameters, the server runtime's MetaServer), as
// JSON lines, one request and its reply at a time.
package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/krcore/krcore/verbs"
)

// Version is the control protocol's version; both sides must agree.
const Version = 3

// Control operations. The client sends one request at a time and reads the
// reply; the server never speaks first. Strict request/reply keeps the
// protocol deadlock-free and lets each side bound every read.
const (
	OpHello       = "hello"       // -> node address
	OpSetup       = "setup"       // client QP endpoint + test -> server endpoint + MR
	OpRun         = "run"         // two-sided tests: server plays its part, replies when done
	OpTeardown    = "teardown"    // server frees the test's resources
	OpConnCreate  = "conn-create" // connect test: server creates, connects, reports phase times
	OpConnClose   = "conn-close"  // connect test: server frees one connection
	OpRaw         = "raw"         // server opens a TCP listener for the baseline
	OpRawDone     = "raw-done"    // server closes the baseline connection
	OpKrStart     = "kr-start"    // server starts its KRCore runtime (once) -> MetaServer info, node id
	OpBye         = "bye"         // end of session
	maxFrameBytes = 1 << 20       // no control message is anywhere near this
)

// MR is what the peer needs to name a memory region remotely.
type MR struct {
	Addr uint64 `json:"addr"`
	RKey uint32 `json:"rkey"`
	Len  int    `json:"len"`
}

// Msg is every control message; unused fields stay empty. One struct keeps
// the protocol readable in a packet capture and in logs (it is JSON).
type Msg struct {
	Op  string `json:"op"`
	Err string `json:"err,omitempty"` // set in a reply: the request failed

	Version int    `json:"version,omitempty"`
	Node    string `json:"node,omitempty"` // the sender's RNIC: a soft node's fabric address, a device and GID
	Fabric  string `json:"fabric,omitempty"`

	Test    string `json:"test,omitempty"`
	Mode    string `json:"mode,omitempty"`
	MaxSize int    `json:"max_size,omitempty"`
	TxDepth int    `json:"tx_depth,omitempty"`
	RxDepth int    `json:"rx_depth,omitempty"`
	Inline  int    `json:"inline,omitempty"`
	Shared  bool   `json:"shared,omitempty"` // setup: the server's MR in a memfd (rawqp.Shape.Shared)
	EP      []byte `json:"ep,omitempty"`     // verbs.Endpoint.MarshalBinary
	MR      *MR    `json:"mr,omitempty"`

	Size  int `json:"size,omitempty"`
	Total int `json:"total,omitempty"` // operations the server takes part in

	// Connect test: how long the server spent creating and connecting, and
	// the value its MR holds, which the client's first READ must see.
	CreateNS int64  `json:"create_ns,omitempty"`
	ModifyNS int64  `json:"modify_ns,omitempty"`
	Token    uint64 `json:"token,omitempty"`

	Port int `json:"port,omitempty"` // raw: the baseline listener's port

	// KRCore runtime: the server's MetaServer (meta.Info.String) and node
	// id, which the client's runtime joins, and the node id the client's
	// runtime takes: the server hands them out, so that a runtime it keeps
	// across sessions (-keep-runtime) never meets two clients under one id.
	Meta   string `json:"meta,omitempty"`
	NodeID uint64 `json:"node_id,omitempty"`
	Client uint64 `json:"client,omitempty"`
}

// Conn is one end of the control connection.
type Conn struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	stop func() bool // undoes the context.AfterFunc that closes conn
}

// NewConn wraps conn; cancelling ctx closes it, which unblocks any read.
func NewConn(ctx context.Context, conn net.Conn) *Conn {
	c := &Conn{conn: conn, r: bufio.NewReader(conn), w: bufio.NewWriter(conn)}
	c.stop = context.AfterFunc(ctx, func() { conn.Close() })
	return c
}

// Close closes the connection.
func (c *Conn) Close() error {
	c.stop()
	return c.conn.Close()
}

// Send writes one message (a JSON line) within timeout.
func (c *Conn) Send(m *Msg, timeout time.Duration) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("control: encode %s: %w", m.Op, err)
	}
	if err := c.conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("control: %w", err)
	}
	c.w.Write(b)
	c.w.WriteByte('\n')
	if err := c.w.Flush(); err != nil {
		return fmt.Errorf("control: send %s to %s: %w", m.Op, c.conn.RemoteAddr(), err)
	}
	return nil
}

// ErrPeerClosed reports the peer closing the control connection.
var ErrPeerClosed = errors.New("control connection closed by peer")

// Recv reads one message within timeout.
func (c *Conn) Recv(timeout time.Duration) (*Msg, error) {
	if err := c.conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	line, err := c.readLine()
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// A peer that closes with our request unread resets the
			// connection instead: it hung up all the same.
			return nil, fmt.Errorf("control: %w", ErrPeerClosed)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("control: peer %s silent for %v: %w", c.conn.RemoteAddr(), timeout, err)
		}
		return nil, fmt.Errorf("control: read from %s: %w", c.conn.RemoteAddr(), err)
	}
	m := &Msg{}
	if err := json.Unmarshal(line, m); err != nil {
		return nil, fmt.Errorf("control: malformed message from %s: %w", c.conn.RemoteAddr(), err)
	}
	return m, nil
}

// readLine reads up to '\n', refusing lines longer than maxFrameBytes so a
// confused peer cannot make us buffer without bound.
func (c *Conn) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := c.r.ReadSlice('\n')
		line = append(line, frag...)
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if len(line) > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if len(line) > maxFrameBytes {
			return nil, fmt.Errorf("message longer than %d bytes", maxFrameBytes)
		}
	}
}

// RemoteError is an error the peer reported in a reply.
type RemoteError struct{ op, text string }

// Error says which request the server failed and why.
func (e *RemoteError) Error() string { return fmt.Sprintf("server failed %s: %s", e.op, e.text) }

// Call sends a request and reads its reply, turning a reply's Err into an
// error.
func (c *Conn) Call(m *Msg, timeout time.Duration) (*Msg, error) {
	if err := c.Send(m, timeout); err != nil {
		return nil, err
	}
	return c.Reply(m.Op, timeout)
}

// Reply reads the reply to a request op sent earlier.
func (c *Conn) Reply(op string, timeout time.Duration) (*Msg, error) {
	r, err := c.Recv(timeout)
	if err != nil {
		return nil, err
	}
	if r.Err != "" {
		return nil, &RemoteError{op: op, text: r.Err}
	}
	if r.Op != op {
		return nil, fmt.Errorf("control: got reply %q to request %q", r.Op, op)
	}
	return r, nil
}

// MarshalEP encodes a QP's endpoint for the wire.
func MarshalEP(qp verbs.QP) ([]byte, error) {
	b, err := qp.Endpoint().MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("encode endpoint of QP %d: %w", qp.Num(), err)
	}
	return b, nil
}

// UnmarshalEP decodes a peer's endpoint.
func UnmarshalEP(b []byte) (verbs.Endpoint, error) {
	var ep verbs.Endpoint
	if err := ep.UnmarshalBinary(b); err != nil {
		return ep, fmt.Errorf("peer endpoint: %w", err)
	}
	return ep, nil
}

// Watch returns a context, from parent, that ends when the peer hangs up
// while it owes no message (the client during a run), so a client killed
// mid-test frees the server at once instead of after its timeout: a read
// that returns then means the connection ended. stop ends the watch and
// must be called before the next Recv.
func (c *Conn) Watch(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := c.r.Peek(1)
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			cancel()
		}
	}()
	return ctx, func() {
		// A deadline in the past wakes the watcher's read; Recv sets a
		// fresh deadline for the next request.
		c.conn.SetReadDeadline(time.Now())
		<-done
		cancel()
	}
}
