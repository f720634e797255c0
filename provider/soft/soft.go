// Package soft is krcore's pure-Go software RNIC: the default provider, the
// one every test runs on, and the one users without RDMA hardware run.
//
// Each Node is one RNIC on one fabric address. Nodes in one process that
// share a Fabric talk over an in-memory wire: a request is carried out in the
// poster's goroutine, so an 8 B READ costs a few hundred nanoseconds. Nodes in
// different processes of one host talk over a shared-memory link, nodes on
// different hosts over TCP (Config.TCPOnly, or KRCORE_SOFT_LINK=tcp, keeps
// same-host peers on TCP too): one link per node pair, all QPs multiplexed on
// it.
//
// The RNIC behaves like hardware where KRCore's problems come from:
//
//   - the target checks rkey, bounds, access flags and PD on every remote
//     operation; a violation completes the request with REM_ACCESS_ERR, moves
//     the requester QP to ERR and flushes its later requests (WR_FLUSH_ERR);
//   - completions are in posting order, and a request completes SUCCESS
//     only once its response is in (READ data landed, atomic result
//     written, ACK received; UC and UD once on the wire). A request that
//     fails its local check (a bad or deregistered lkey) while earlier
//     ones still wait for their responses stops the send queue: the
//     earlier ones complete as their responses arrive, then it reports
//     its error and the rest flush, as rxe's completer does;
//   - a QP reset and made ready again is a new incarnation: responses to
//     requests from before the reset are dropped, whatever their PSN;
//   - posting to a full send queue or a QP not in RTS fails; send queue slots
//     are freed only when a later signaled completion is polled (as mlx5);
//   - RC is in order and exactly once; a SEND without a posted receive is
//     retried after the receiver's RNR timer and fails with RNR_RETRY_EXC_ERR;
//   - one-sided operations never run application code on the target;
//   - atomics need 8-byte aligned remote addresses (REM_INV_REQ_ERR);
//   - UD messages are limited to the MTU and arrive after a 40-byte GRH;
//   - a DCI reaches any DCT given node address, DCT number and access key
//     (unless Config.NoDC makes the node a DC-less device, as rxe is);
//   - RC needs the remote QP created and in RTR with matching PSNs: requests
//     to anything else are dropped, and the requester fails with
//     RETRY_EXC_ERR after its retry timeout, as it does when a link dies.
//
// # Wire protocol
//
// A TCP link starts with a hello from each side (the dialer's first) carrying
// the protocol version (currently 3) and the node's fabric address; a peer on
// another version is refused. Every frame is a 4-byte big-endian length
// followed by a 64-byte header and a payload:
//
//	off size field
//	  0    1 type: 1 request, 2 response, 3 hello, 4 hello-ack
//	  1    1 opcode (request: verbs.Opcode)
//	  2    1 syndrome (response: 0 ACK, 1 RNR NAK, 2 access NAK,
//	         3 invalid-request NAK, 4 remote-operation NAK, 5 DC key NAK,
//	         6 no-such-DCT NAK)
//	  3    1 flags: 1 immediate present, 2 solicited, 4 from a DCI,
//	         8 DC connect
//	  4    4 destination QPN
//	  8    4 source QPN
//	 12    4 PSN (one per message)
//	 16    4 rkey (UD: qkey)
//	 20    8 remote address
//	 28    8 compare/add (response: original atomic value)
//	 36    8 swap
//	 44    4 immediate data
//	 48    4 READ length
//	 52    8 DC access key
//	 60    4 requester generation (new each time an RC QP or DCI
//	         reaches RTS; a response echoes its request's)
//	 64      payload: SEND/WRITE data, READ response data
//
// A requester accepts a response only if it carries the generation the QP
// has now: a QP reset and made ready again may reuse its PSNs, and a
// response to a request from its previous life (held in a slow network or
// responder) must not complete a new request.
//
// Requests on one QP carry consecutive PSNs; the responder executes only the
// PSN it expects and drops the rest, so after an RNR NAK the requester goes
// back to the NAKed message and resends (go-back-N), which keeps RC exactly
// once. A DCT sequences each initiator the same way: a DCI request sent with
// nothing else in flight carries flag 8 (connect) and sets the PSN the DCT
// expects from that DCI, as the DC connect packet does on hardware, so a
// request pipelined behind a failed one is never executed. Responses return
// in request order. ACKs are cumulative, as on InfiniBand: an ACK (syndrome
// 0, no payload) for an RC request also acknowledges every earlier request
// of that QP still unanswered, so a responder that has read a run of WRITEs
// and SENDs may answer them with one ACK carrying the last PSN (it sends it
// before anything else it sends on the link, and before it waits for more
// input). READ and atomic responses, and NAKs, answer one request each. A
// requester writes what is queued on a QP in one system call. A malformed
// frame closes the link.
//
// # Shared-memory link
//
// Two nodes that listen on TCP and run in different processes of one host
// (same user, user namespace and boot) find each other through an abstract
// unix socket named after the TCP address, exchange a memfd over it, and
// carry the same frames as on TCP through two byte rings of ShmRingSize in
// it, one per direction (ShmSegmentSize mapped per link, off the Go heap).
// The unix socket stays open as the link's doorbell and liveness: a peer
// process that dies closes it. shm.go and shmring.go have the details; a
// peer that cannot be reached this way is reached over TCP, and
// Node.PeerLink says why.
//
// On a shared-memory link an RC READ or WRITE whose target MR lies in a
// sealed memfd (offheap.AllocShared memory) is carried out in place: the
// requester copies between its SGEs and the responder's memory itself,
// once, as DMA, after checking key, bounds, rights, PD and the responder
// QP's state in a table only the responder writes (and peers map
// read-only); deregistration and QP teardown fence such copies, and a
// request goes in place only when nothing earlier on its QP is still
// outstanding. Atomics, SENDs and WRITE_WITH_IMM take the ring. A plain
// ACK is put in the ring at once but wakes a sleeping peer only with what
// the responder sends next (the reply to a SEND) or once its reader finds
// the ring empty, so a SEND ping-pong wakes each side once per message.
// shmplace.go states the trust model (same user: the peer maps the
// responder's whole memfd) and what a peer killed mid-copy can leave.
//
// # Reading a link
//
// Each TCP or shared-memory link has a reader goroutine, but a goroutine
// blocked in CQ.Wait for a completion due on a link reads that link itself
// while it waits, so a response wakes the goroutine that wants it instead
// of passing through a second one (read.go and shmrole.go explain the
// hand-over of this role). Requests from the peer are served whichever
// goroutine reads. On a shared-memory link a QP keeps at most about one
// ring of READ responses, and of WRITE and SEND payloads, in flight.
package soft

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	crand "crypto/rand"

	"github.com/krcore/krcore/verbs"
)

// Defaults for Config fields left zero.
const (
	DefaultRetryTimeout = 2 * time.Second
	DefaultRNRTimer     = 200 * time.Microsecond
	DefaultMTU          = 4096
)

// Config configures a Node.
type Config struct {
	// Name names an in-memory node ("mem:NAME" is its address); ignored
	// when Listen is set. Empty picks a unique name.
	Name string
	// Listen, if set, makes the node reachable over TCP at this address
	// ("127.0.0.1:0" picks a port). Its address is then the bound one.
	Listen string
	// RetryTimeout bounds how long a request waits for its response (a dead
	// link, a peer QP that does not exist) before RETRY_EXC_ERR, when the
	// QP's own Timeout*RetryCount is not set. Default DefaultRetryTimeout.
	RetryTimeout time.Duration
	// DialTimeout bounds one link set-up (a TCP connect and its hello, a
	// shared-memory hello); default RetryTimeout. A request waiting for its
	// link has not gone out: its retry timeout runs once the set-up ends.
	DialTimeout time.Duration
	// Attr overrides the device limits; zero fields keep the defaults.
	Attr verbs.DeviceAttr
	// MTU is the port MTU; default DefaultMTU.
	MTU int
	// NoDC makes the node a device without the Dynamically Connected
	// transport, like kernel soft-RoCE (rxe) through libibverbs:
	// Attr().DCSupported is false and CreateQP(DCI or DCT) fails with
	// verbs.ErrUnsupported, so DC-less code paths run on every machine.
	NoDC bool
	// TCPOnly makes the node reach nodes in other processes of this host
	// over TCP, as it does other hosts, instead of by shared memory (see
	// shm.go); EnvLink=tcp in the environment does it for every node.
	TCPOnly bool
}

// defaultAttr is what a soft RNIC can do.
var defaultAttr = verbs.DeviceAttr{
	MaxQP: 1 << 18, MaxQPWR: 1 << 14, MaxSGE: 16, MaxCQ: 1 << 16, MaxCQE: 1 << 20,
	MaxMR: 1 << 20, MaxMRSize: 1 << 40, MaxPD: 1 << 16, MaxSRQ: 1 << 14, MaxSRQWR: 1 << 14,
	MaxInline: 256, MaxMsgSize: maxPayload, AtomicCap: true, DCSupported: true, SRQSupported: true,
	ProgressInWait: true, // a CQ waiter reads its link itself (see read.go)
}

// Fabric is an in-process network of nodes joined by an in-memory wire.
type Fabric struct {
	mu    sync.RWMutex
	nodes map[string]*Node
}

// NewFabric returns an empty in-memory fabric.
func NewFabric() *Fabric { return &Fabric{nodes: make(map[string]*Node)} }

// DefaultFabric is the fabric Provider uses when none is given.
var DefaultFabric = NewFabric()

var nodeSeq atomic.Uint64

// NewNode starts a node on the fabric. If cfg.Listen is set it is also
// reachable over TCP; in-process peers on the fabric still use memory.
func (fab *Fabric) NewNode(cfg Config) (*Node, error) {
	n, err := newNode(fab, cfg)
	if err != nil {
		return nil, err
	}
	fab.mu.Lock()
	_, dup := fab.nodes[n.addr]
	if !dup {
		fab.nodes[n.addr] = n
	}
	fab.mu.Unlock()
	if dup {
		// Closed without fab.mu held: Close takes it to leave the fabric
		// (and leaves the node already there in place).
		n.Close()
		return nil, fmt.Errorf("soft: node address %s already on the fabric: %w", n.addr, ErrAddrInUse)
	}
	return n, nil
}

// ErrAddrInUse is returned by Fabric.NewNode when another node on the
// fabric has the address asked for, or the TCP address to listen on is
// taken (by a node on any fabric, or another process). It wraps
// verbs.ErrInvalid.
var ErrAddrInUse = fmt.Errorf("address in use: %w", verbs.ErrInvalid)

func (fab *Fabric) lookup(addr string) *Node {
	if fab == nil {
		return nil
	}
	fab.mu.RLock()
	defer fab.mu.RUnlock()
	return fab.nodes[addr]
}

func (fab *Fabric) remove(n *Node) {
	if fab == nil {
		return
	}
	fab.mu.Lock()
	if fab.nodes[n.addr] == n {
		delete(fab.nodes, n.addr)
	}
	fab.mu.Unlock()
}

// NewNode starts a node on no in-memory fabric: every peer is reached over
// TCP. Set cfg.Listen for peers to reach it.
func NewNode(cfg Config) (*Node, error) { return newNode(nil, cfg) }

// Provider opens soft nodes as verbs devices: Open(ctx, name) starts a node
// named name on Fabric (DefaultFabric if nil) with Config as a template.
type Provider struct {
	Fabric *Fabric
	Config Config
}

// Name returns "soft".
func (p *Provider) Name() string { return "soft" }

// Devices lists the nodes on the provider's fabric.
func (p *Provider) Devices() ([]string, error) {
	fab := p.fabric()
	fab.mu.RLock()
	defer fab.mu.RUnlock()
	names := make([]string, 0, len(fab.nodes))
	for a := range fab.nodes {
		names = append(names, a)
	}
	return names, nil
}

// Open starts a new node. name is its in-memory name, or with a ':' a TCP
// listen address.
func (p *Provider) Open(ctx context.Context, name string) (verbs.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg := p.Config
	if strings.Contains(name, ":") {
		cfg.Listen = name
	} else {
		cfg.Name = name
	}
	return p.fabric().NewNode(cfg)
}

func (p *Provider) fabric() *Fabric {
	if p.Fabric == nil {
		return DefaultFabric
	}
	return p.Fabric
}

// keySource makes unpredictable keys: a ChaCha8 stream seeded from the
// operating system, so a peer cannot guess an rkey from the ones it saw.
type keySource struct {
	mu  sync.Mutex
	rng *rand.ChaCha8
}

func newKeySource() *keySource {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		panic("soft: no entropy for keys: " + err.Error()) // crypto/rand never fails on Linux
	}
	return &keySource{rng: rand.NewChaCha8(seed)}
}

func (k *keySource) next() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rng.Uint64()
}

var errNodeClosed = fmt.Errorf("soft: node closed: %w", verbs.ErrClosed)

// checkOpen returns ErrClosed once the node is closed.
func (n *Node) checkOpen() error {
	if n.closed.Load() {
		return errNodeClosed
	}
	return nil
}

var errNilArg = errors.New("nil argument")
