package racekv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/verbs"
)

// Name is the name a memory node exports its region under.
const Name = "racekv"

// remoteAccess is what clients may do to a region: READ, WRITE, atomics.
const remoteAccess = verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic

// Node is a memory node: its table region, registered with a krcore
// runtime and exported under Name (for VQ clients), and, once ServeRC
// runs, registered again on the device for raw RC clients.
type Node struct {
	api krcore.API
	mr  krcore.MR

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewNode formats a region of api's node as memory node index of a table
// of geometry g and exports it.
func NewNode(api krcore.API, g Geometry, index int) (*Node, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	mr, err := api.RegMR(g.RegionSize(), verbs.AccessAll)
	if err != nil {
		return nil, fmt.Errorf("racekv: register a %d B region: %w", g.RegionSize(), err)
	}
	n := &Node{api: api, mr: mr, conns: map[net.Conn]struct{}{}}
	if err := Format(mr.Bytes(), g, index); err != nil {
		api.Deregister(mr)
		return nil, err
	}
	if err := api.Export(Name, mr, 0, mr.Len(), remoteAccess); err != nil {
		api.Deregister(mr)
		return nil, fmt.Errorf("racekv: export the region: %w", err)
	}
	return n, nil
}

// Local reaches the region in place, for loading it before clients come.
func (n *Node) Local() *Local { return NewLocal(n.mr.Bytes()) }

// ServeRC accepts raw RC clients (DialRC) on ln until ctx ends or ln is
// closed: for each, it registers the region on dev (once), creates an RC
// QP, connects it to the client's and sends back its endpoint and the
// region's address and rkey; the QP lives until the client hangs up. dev
// must be the device of the node's runtime. The QPs connect with path's
// attributes.
func (n *Node) ServeRC(ctx context.Context, dev verbs.Device, ln net.Listener, path verbs.Path) (err error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return fmt.Errorf("racekv: alloc PD: %w", err)
	}
	cq, err := dev.CreateCQ(16)
	if err != nil {
		pd.Close()
		return fmt.Errorf("racekv: create CQ: %w", err)
	}
	mr, err := pd.RegMR(n.mr.Bytes(), verbs.AccessLocalWrite|remoteAccess)
	if err != nil {
		cq.Close()
		pd.Close()
		return fmt.Errorf("racekv: register the region for RC clients: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() {
		stop()
		n.mu.Lock()
		for c := range n.conns {
			c.Close()
		}
		n.mu.Unlock()
		n.wg.Wait()
		err = errors.Join(err, mr.Close(), cq.Close(), pd.Close())
	}()
	for {
		conn, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil || errors.Is(aerr, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("racekv: accept RC client: %w", aerr)
		}
		n.mu.Lock()
		n.conns[conn] = struct{}{}
		n.mu.Unlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.serveRC(ctx, conn, pd, cq, mr, path)
			n.mu.Lock()
			delete(n.conns, conn)
			n.mu.Unlock()
		}()
	}
}

// serveRC is one RC client: the exchange, then a QP until it hangs up.
func (n *Node) serveRC(ctx context.Context, conn net.Conn, pd verbs.PD, cq verbs.CQ, mr verbs.MR, path verbs.Path) {
	c := control.NewConn(ctx, conn)
	defer c.Close()
	req, err := c.Recv(exchangeTimeout)
	if err != nil || req.Op != control.OpConnCreate {
		return
	}
	reply := &control.Msg{Op: control.OpConnCreate}
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err == nil {
		defer qp.Close()
		err = n.connectRC(qp, req, reply, mr, path)
	}
	if err != nil {
		reply.Err = err.Error()
	}
	if c.Send(reply, exchangeTimeout) != nil || err != nil {
		return
	}
	// The QP lives as long as the connection, however long the client
	// stays: the exchange's deadline must not end it.
	if conn.SetReadDeadline(time.Time{}) != nil {
		return
	}
	io.Copy(io.Discard, conn) // until the client hangs up (or ctx ends)
}

// connectRC connects qp to the client's endpoint and fills the reply.
func (n *Node) connectRC(qp verbs.QP, req, reply *control.Msg, mr verbs.MR, path verbs.Path) error {
	remote, err := control.UnmarshalEP(req.EP)
	if err != nil {
		return err
	}
	if err := verbs.Connect(qp, remote, path); err != nil {
		return err
	}
	if reply.EP, err = control.MarshalEP(qp); err != nil {
		return err
	}
	reply.MR = &control.MR{Addr: mr.Addr(), RKey: mr.RKey(), Len: mr.Len()}
	return nil
}

// Close withdraws the export and releases the region (after ServeRC
// returned).
func (n *Node) Close() error {
	return errors.Join(n.api.Unexport(Name), n.api.Deregister(n.mr))
}
