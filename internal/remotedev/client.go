package remotedev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/krcore/krcore/verbs"
)

// Defaults for Options fields left zero.
const (
	// DefaultCallTimeout bounds one call's round trip. Generous because a
	// call may wait behind the server's RNIC (an RC connect to a peer that
	// is slow to answer) and tests run on loaded machines with -race.
	DefaultCallTimeout = 30 * time.Second
	// DefaultWaitSlice bounds one server-side CQ wait; CQ.Wait repeats
	// slices until its context ends.
	DefaultWaitSlice = 250 * time.Millisecond
)

// Options tune a Client. The zero value is usable.
type Options struct {
	// CallTimeout bounds every call that has no context of its own;
	// default DefaultCallTimeout.
	CallTimeout time.Duration
	// WaitSlice bounds one server-side CQ wait; default DefaultWaitSlice.
	WaitSlice time.Duration
}

func (o Options) withDefaults() Options {
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.WaitSlice <= 0 {
		o.WaitSlice = DefaultWaitSlice
	}
	return o
}

// Client is a verbs.Device served by another process. It is safe for
// concurrent use, as are the objects made from it.
type Client struct {
	s    *stream
	opt  Options
	info hello

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *response
	unpins  map[*mr]func() // client blocks pinned by live registrations

	wg   sync.WaitGroup // the read loop
	gone chan struct{}  // closed by the read loop once it has cleaned up
}

var _ verbs.Device = (*Client)(nil)

// Dial connects to a Serve listening at addr (network "unix" or "tcp").
func Dial(ctx context.Context, network, addr string, opt Options) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("remote: dial %s %s: %w", network, addr, err)
	}
	return NewClient(ctx, conn, opt)
}

// NewClient speaks to a Serve on the other end of conn and returns the
// device it serves. The Client owns conn and closes it with Close. ctx
// bounds the hello exchange only.
func NewClient(ctx context.Context, conn io.ReadWriteCloser, opt Options) (*Client, error) {
	c := &Client{
		s:       newStream(conn),
		opt:     opt.withDefaults(),
		pending: make(map[uint64]chan *response),
		unpins:  make(map[*mr]func()),
		gone:    make(chan struct{}),
	}
	c.wg.Add(1)
	go c.readLoop()
	resp, err := c.callCtx(ctx, &request{Op: opHello, Version: protocolVersion}, 0)
	if err == nil && (resp.Hello == nil || resp.Hello.Version != protocolVersion) {
		err = fmt.Errorf("remote: server speaks a different protocol version: %w", verbs.ErrUnsupported)
	}
	if err != nil {
		c.shutdown()
		return nil, err
	}
	c.info = *resp.Hello
	return c, nil
}

// readLoop is owned by the Client: it ends when the stream does, and then
// fails every pending call (they watch s.done).
func (c *Client) readLoop() {
	defer c.wg.Done()
	for {
		resp := new(response)
		if err := c.s.recv(resp); err != nil {
			c.releasePins()
			close(c.gone)
			return
		}
		c.mu.Lock()
		ch := c.pending[resp.Seq]
		delete(c.pending, resp.Seq)
		c.mu.Unlock()
		if ch != nil { // nil: the caller gave up
			ch <- resp
		}
	}
}

// call makes a call bounded by CallTimeout.
func (c *Client) call(req *request) (*response, error) {
	return c.callCtx(context.Background(), req, 0)
}

// callCtx makes a call bounded by ctx and by CallTimeout plus extra (the
// time the server is asked to block). A server error comes back as an
// *Error; a broken stream as an error wrapping verbs.ErrClosed.
func (c *Client) callCtx(ctx context.Context, req *request, extra time.Duration) (*response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opt.CallTimeout+extra)
	defer cancel()
	ch := make(chan *response, 1)
	c.mu.Lock()
	c.next++
	req.Seq = c.next
	c.pending[req.Seq] = ch
	c.mu.Unlock()
	defer c.forget(req.Seq)

	if err := c.s.send(ctx, req); err != nil {
		return nil, callError(req.Op, err)
	}
	select {
	case resp := <-ch:
		if resp.Err != nil {
			return resp, callError(req.Op, resp.Err.decode())
		}
		return resp, nil
	case <-c.s.done:
		return nil, callError(req.Op, c.s.err())
	case <-ctx.Done():
		return nil, callError(req.Op, fmt.Errorf("no reply: %w", ctx.Err()))
	}
}

func (c *Client) forget(seq uint64) {
	c.mu.Lock()
	delete(c.pending, seq)
	c.mu.Unlock()
}

// Close closes the served device and the connection. Registrations made
// through the client are released on both sides.
func (c *Client) Close() error {
	_, err := c.call(&request{Op: opCloseDevice})
	c.shutdown()
	return err
}

// shutdown ends the stream and waits for the client's goroutines.
func (c *Client) shutdown() {
	c.s.close()
	c.wg.Wait()
	c.releasePins()
}

// Done is closed when the connection to the server has ended and the
// client has released the memory its registrations pinned.
func (c *Client) Done() <-chan struct{} { return c.gone }

// ServerPID is the process ID of the server, as it reported it.
func (c *Client) ServerPID() int { return c.info.PID }

// Control sends a named request to the server's Control hook (see Server),
// for operations outside the verbs API such as breaking a link in a test.
func (c *Client) Control(ctx context.Context, name string, arg []byte) ([]byte, error) {
	resp, err := c.callCtx(ctx, &request{Op: opControl, Name: name, Data: arg}, 0)
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

// Name is the served device's name.
func (c *Client) Name() string { return c.info.Name }

// Attr is the served device's limits.
func (c *Client) Attr() verbs.DeviceAttr { return c.info.Attr }

// Port asks the server for the port's state. If the server cannot be
// reached the port is reported down.
func (c *Client) Port() verbs.PortAttr {
	resp, err := c.call(&request{Op: opPort})
	if err != nil || resp.Port == nil {
		return verbs.PortAttr{Num: 1}
	}
	return *resp.Port
}

// AllocPD allocates a protection domain on the server.
func (c *Client) AllocPD() (verbs.PD, error) {
	resp, err := c.call(&request{Op: opAllocPD})
	if err != nil {
		return nil, err
	}
	return &pd{c: c, h: resp.H}, nil
}

// CreateCQ creates a completion queue on the server.
func (c *Client) CreateCQ(cqe int) (verbs.CQ, error) {
	resp, err := c.call(&request{Op: opCreateCQ, N: cqe})
	if err != nil {
		return nil, err
	}
	return &cq{c: c, h: resp.H, cap: resp.N}, nil
}

// closeHandle closes a server object.
func (c *Client) closeHandle(h uint64) error {
	_, err := c.call(&request{Op: opClose, H: h})
	return err
}

func (c *Client) pin(m *mr, unpin func()) {
	c.mu.Lock()
	c.unpins[m] = unpin
	c.mu.Unlock()
}

// unpin releases one registration's pin on the client's block.
func (c *Client) unpin(m *mr) {
	c.mu.Lock()
	unpin := c.unpins[m]
	delete(c.unpins, m)
	c.mu.Unlock()
	if unpin != nil {
		unpin()
	}
}

// releasePins drops every pin once the server is gone: its registrations
// went with it (Serve closes them), so the client's blocks may be freed.
func (c *Client) releasePins() {
	c.mu.Lock()
	unpins := c.unpins
	c.unpins = make(map[*mr]func())
	c.mu.Unlock()
	for _, unpin := range unpins {
		unpin()
	}
}

// connLost reports whether err means the server can no longer hold state
// for this client.
func (c *Client) connLost(err error) bool {
	select {
	case <-c.s.done:
		return errors.Is(err, verbs.ErrClosed)
	default:
		return false
	}
}

var pid = os.Getpid()
