package lite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// DefaultPort is the port a Node's endpoint binds when Options.Port is 0.
const DefaultPort = 0x4c54

// Sizes of the control plane and of the data path's bounce buffer.
const (
	slotSize   = 256      // one control message
	slots      = 16       // receive buffers posted at the endpoint
	bounceSize = 64 << 10 // largest single READ or WRITE of the data path
	maxName    = 128      // an LMR name, leaving room for the grant prefix
	ctlTimeout = 5 * time.Second
)

// Errors of package lite; every error lite returns wraps one of these or a
// krcore sentinel or WC status.
var (
	// ErrPerm: the LMR's master refused a permission the LMR does not allow.
	ErrPerm = errors.New("lite: permission denied")
	// ErrFreed: the LMR was freed by its master, or no LMR has the name.
	ErrFreed = errors.New("lite: no such LMR (freed or never made)")
	// ErrBadHandle: the handle is zero, unmapped, or another Node's.
	ErrBadHandle = errors.New("lite: bad handle")
)

// Perm is a set of permissions on an LMR.
type Perm uint8

// The permissions a mapper asks for and an LMR allows.
const (
	Read Perm = 1 << iota
	Write
	Atomic
	permAll = Read | Write | Atomic | Share | Admin
)

// access is the remote access that grants p.
func (p Perm) access() verbs.Access {
	var a verbs.Access
	if p&Read != 0 {
		a |= verbs.AccessRemoteRead
	}
	if p&Write != 0 {
		a |= verbs.AccessRemoteWrite
	}
	if p&Atomic != 0 {
		a |= verbs.AccessRemoteAtomic
	}
	return a
}

// Options configure a Node.
type Options struct {
	// Port is the port the endpoint binds, the same on every node of a
	// LITE cluster; 0 is DefaultPort.
	Port uint32
	// Directory is the node whose Node keeps the names of the LMRs every
	// Node naming it masters (Malloc lists, Free withdraws, MapName finds
	// them): the same on every node of a LITE cluster; 0 is this node.
	Directory krcore.NodeID
	// CallTimeout bounds an RPC Call or a Send whose context has no
	// deadline: it ends within CallTimeout, after at least half of it
	// (such calls share one deadline); 0 is DefaultCallTimeout.
	CallTimeout time.Duration
}

// Node is a process's LITE endpoint: the master of the LMRs it Mallocs and
// the mapper of the handles it Maps. Its methods are safe for concurrent use.
type Node struct {
	api  krcore.API
	port uint32
	opts Options

	// srv holds port: serve reads the messages to it, and this Node's
	// requests go out from it (ctlMu held), so that the node asked sees
	// them from the principal (this node, port) its runtime vouches for,
	// the one a master grants to.
	srv    krcore.VQ
	srvAt  krcore.NodeID // the node srv is connected to (0: none), ctlMu
	inbox  krcore.MR
	cancel context.CancelFunc
	done   chan struct{}
	// pop says who pops srv's messages: serve, or a Recv (pop.go).
	pop popRole

	ctlMu  sync.Mutex // ctl, srv's sending, outbox
	ctl    krcore.VQ  // replies go out from it
	outbox krcore.MR

	dataMu sync.Mutex // data, bounce
	data   krcore.VQ
	bounce krcore.MR
	dataAt krcore.NodeID // the node data is connected to (0: none)
	// dataReq and dataOut are post's request and completion: fields, not
	// locals, so that handing them to the VQ interface allocates nothing;
	// dataMu held.
	dataReq [1]krcore.Request
	dataOut [1]krcore.Completion

	sync syncer // atomics, locks, barriers

	// qmu guards replacing ctl and data (done with ctlMu or dataMu held
	// too), so that Close can close them while a waiter holds those.
	qmu sync.Mutex

	mu      sync.Mutex
	closed  bool
	seq     uint64
	lmrs    map[string]*LMR     // mastered here, by name
	grants  map[string]*grant   // mastered here, by export name
	maps    map[uint64]*mapping // mapped here, by handle id
	loans   map[loan]string     // Memcpy's loans of grants mapped here, by loan (memop.go)
	pending map[uint64]waiter   // control requests awaiting replies, by id
	pieces  map[string]*holding // held here for LMRs' masters, by id
	exports map[string]*export  // of the pieces held here, by name

	ops       ops           // goroutines of long requests (memop.go)
	pieceTail chan struct{} // closed when the last piece operation ends; serve's (spawnPieceOp)

	redone atomic.Uint64 // operations redone on a moved LMR's new copy (move.go)

	dirNode krcore.NodeID            // Options.Directory
	names   map[string]krcore.NodeID // the directory's: name -> master, n.mu
	rpc     rpcState                 // RPC and messages (rpc.go, rpcring.go, msg.go)
	qos     qosGate                  // admits Low priority operations (qos.go)
}

// Open starts the LITE endpoint of api's node: it binds opts.Port and
// serves other nodes' control messages until Close.
func Open(ctx context.Context, api krcore.API, opts Options) (*Node, error) {
	if api == nil {
		return nil, fmt.Errorf("lite: open: nil API: %w", krcore.ErrInvalid)
	}
	n := &Node{api: api, port: opts.Port, opts: opts, dirNode: opts.Directory, done: make(chan struct{}), pop: newPopRole(),
		lmrs: map[string]*LMR{}, grants: map[string]*grant{}, maps: map[uint64]*mapping{}, loans: map[loan]string{}, pending: map[uint64]waiter{},
		pieces: map[string]*holding{}, exports: map[string]*export{}}
	// Request ids start at random: a Node that had the port before may
	// still be owed replies (a barrier released late, a master's answer
	// after a timeout), and ids counted from 1 again would take them as
	// this Node's.
	n.seq = rand.Uint64() >> 1
	if n.port == 0 {
		n.port = DefaultPort
	}
	if err := n.setup(); err != nil {
		n.release()
		return nil, fmt.Errorf("lite: open port %d: %w", n.port, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.ops.ctx = sctx
	go n.serve(sctx)
	return n, nil
}

// setup makes the endpoint's queues and buffers.
func (n *Node) setup() error {
	var err error
	if n.srv, err = n.api.Queue(); err != nil {
		return err
	}
	if n.ctl, err = n.api.Queue(); err != nil {
		return err
	}
	if n.data, err = n.api.Queue(); err != nil {
		return err
	}
	if n.inbox, err = n.api.RegMR(slots*slotSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if n.outbox, err = n.api.RegMR(slotSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if n.bounce, err = n.api.RegMR(bounceSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if err = n.srv.Bind(n.port); err != nil {
		return err
	}
	for i := range slots {
		if err = n.srv.PushRecv(n.inbox.Range(i*slotSize, slotSize)); err != nil {
			return err
		}
	}
	return nil
}

// Close stops the endpoint: it frees every LMR this Node masters, tells
// the masters of what it mapped to withdraw those grants (one SEND each,
// within a second; a master that does not get it keeps them until the LMR
// is freed), stops
// the serving goroutine, fails control requests waiting for replies with
// krcore.ErrClosed and releases the queues and memory it made. The API
// stays open.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	lmrs := make([]*LMR, 0, len(n.lmrs))
	for _, l := range n.lmrs {
		lmrs = append(lmrs, l)
	}
	n.mu.Unlock()
	n.qos.close() // fails Low's waiters
	var errs []error
	for _, l := range lmrs {
		errs = append(errs, l.Free())
	}
	n.unmapAll(time.Second)
	n.closeRPC(time.Second) // answers the calls its services hold, within a bound
	n.cancel()
	n.srv.Close() // wakes serve's PopMsgsWait
	<-n.done
	n.stopSync()
	n.stopOps()
	n.releaseRPC()
	n.stopBounds()
	n.releasePieces()
	n.release()
	return errors.Join(errs...)
}

// release closes the queues and deregisters the buffers setup made. It
// closes the queues first, under qmu, which wakes a Read, Write or control
// SEND waiting on them, then takes their locks and closes them again: a
// waiter woken that way may have renewed its queue before it saw closed.
func (n *Node) release() {
	n.closeQueues()
	n.ctlMu.Lock()
	n.dataMu.Lock()
	n.closeQueues()
	for _, m := range []krcore.MR{n.inbox, n.outbox, n.bounce} {
		if m != nil {
			n.api.Deregister(m)
		}
	}
	n.dataMu.Unlock()
	n.ctlMu.Unlock()
}

// closeQueues closes the Node's queues (closing one twice is harmless).
func (n *Node) closeQueues() {
	n.qmu.Lock()
	defer n.qmu.Unlock()
	for _, q := range []krcore.VQ{n.srv, n.ctl, n.data} {
		if q != nil {
			q.Close()
		}
	}
}

// stopped reports whether serve stopped, after which no reply arrives;
// Close stops it after it freed the LMRs this Node masters.
func (n *Node) stopped() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// isClosed reports whether Close began.
func (n *Node) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}
