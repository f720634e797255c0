package lite

import (
	"context"
	"fmt"

	"github.com/krcore/krcore"
)

// Messages between named endpoints ride on the RPC rings rather than on
// plain SENDs: a SEND needs a receive buffer posted at the receiver, and
// the LITE port's few buffers serve the control plane, so a burst of
// messages would crowd out Map and Unmap, or be held in the runtime's
// inbox and past its bound dropped without a word. A ring slot is a credit
// the sender holds until the receiver acknowledges: a sender never
// overwrites and is never dropped, it waits; a message up to MaxRPC bytes
// is one WRITE_WITH_IMM; and Send learns that the message reached the
// endpoint (or that there is none: ErrNoEndpoint).

// epQueue is how many messages an endpoint acknowledges before they are
// taken: one past it is acknowledged when a Recv moves it within, so that
// a receiver that falls behind holds its senders' credits instead of
// growing without bound.
const epQueue = 256

// Msg is a message an Endpoint received.
type Msg struct {
	// From is the sender's node.
	From krcore.NodeID
	// Data is the message, the receiver's to keep.
	Data []byte
}

// Endpoint receives the messages sent to its name at this Node (Send).
// Its methods are safe for concurrent use.
type Endpoint struct {
	n    *Node
	name string
	q    callQueue
}

// Endpoint makes the message endpoint name at this Node. A name in use is
// ErrBusy; a name must be 1 to 255 bytes.
func (n *Node) Endpoint(name string) (*Endpoint, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("lite: endpoint %q: %w", name, krcore.ErrInvalid)
	}
	r := n.rpcInit()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, fmt.Errorf("lite: endpoint %q: %w", name, krcore.ErrClosed)
	case r.endpoints[name] != nil:
		return nil, fmt.Errorf("lite: endpoint %q: %w", name, krcore.ErrBusy)
	}
	e := &Endpoint{n: n, name: name, q: newCallQueue(epQueue)}
	r.endpoints[name] = e
	return e, nil
}

// Send sends msg (at most MaxRPC bytes, less the name's length) to the
// endpoint name at node and returns once the endpoint holds it. Without a
// free slot in this node's ring at node, it waits; the deadline is ctx's,
// or Options.CallTimeout (see Options) when ctx has none.
func (n *Node) Send(ctx context.Context, node krcore.NodeID, name string, msg []byte) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("lite: send to %q at node %d: %w", name, node, krcore.ErrInvalid)
	}
	if _, err := n.call(ctx, node, 0, kindMsg, name, msg, nil); err != nil {
		return fmt.Errorf("lite: send to %q at node %d: %w", name, node, err)
	}
	return nil
}

// Recv waits for the next message, in the order the endpoint received
// them. A closed Endpoint or Node is krcore.ErrClosed.
func (e *Endpoint) Recv(ctx context.Context) (Msg, error) {
	c, moved, err := e.q.pop(ctx, false, e.n)
	if err != nil {
		return Msg{}, fmt.Errorf("lite: endpoint %q: recv: %w", e.name, err)
	}
	if moved != nil {
		e.n.ackAsync(moved)
	}
	return Msg{From: c.From, Data: c.Req}, nil
}

// Close stops the endpoint: Recv fails with krcore.ErrClosed and the
// messages not yet taken are refused to their senders (ErrNoEndpoint), or
// lost if their senders were told already. The name is free again.
func (e *Endpoint) Close() error {
	r := &e.n.rpc
	r.mu.Lock()
	if r.endpoints[e.name] == e {
		delete(r.endpoints, e.name)
	}
	r.mu.Unlock()
	for _, c := range e.q.close() {
		if c.ackLater {
			e.n.replyErrAsync(c, codeNoEndpoint, 0)
		}
	}
	return nil
}

// toEndpoint queues a message for the endpoint name, on serve, and
// acknowledges it unless the endpoint is full.
func (n *Node) toEndpoint(name string, c *Call) {
	r := &n.rpc
	r.mu.Lock()
	e := r.endpoints[name]
	r.mu.Unlock()
	if e == nil {
		n.replyErrAsync(c, codeNoEndpoint, 0)
		return
	}
	ok, ackNow := n.queue(&e.q, c)
	switch {
	case !ok:
		n.replyErrAsync(c, codeNoEndpoint, 0)
	case ackNow:
		n.ackAsync(c)
	}
}

// ackAsync acknowledges a message with an empty reply, on a goroutine of
// the Node.
func (n *Node) ackAsync(c *Call) {
	n.goRPC(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
		defer cancel()
		n.reply(ctx, c, immReply, nil) // a lost ack ends the Send at its deadline
	})
}
