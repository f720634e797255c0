//go:build linux

package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
	"golang.org/x/sys/unix"
)

// memory is a client's MR: its memfd mapped here and registered.
type memory struct {
	mr  krcore.MR
	blk *offheap.Block
}

// session is one attached client and everything it owns.
type session struct {
	s    *Server
	id   uint64
	conn *net.UnixConn
	cred *unix.Ucred

	ctx    context.Context // ends when the client goes
	cancel context.CancelFunc
	sendMu sync.Mutex // replies and OpBye

	mu      sync.RWMutex
	mrs     map[uint64]*memory
	mrBytes int64
	regions map[uint64]krcore.Region
	vqs     map[uint64]*vq
	exports map[string]uint64       // name: the MR exported, whose Deregister withdraws it
	reports map[string]storedReport // by name (OpReport)

	pump *pump // drives every VQ of the client

	// remote bounds and tracks the calls that wait for other nodes
	// (Region, Connect), which run beside serve's loop: a client that
	// looks a region up while it registers memory or makes its queue gets
	// those answered meanwhile, not after the other node's reply.
	remote     chan struct{} // a token per call running
	remoteCall sync.WaitGroup

	attached bool // its OpHello was answered; written by serve alone, before any call runs beside it

	pushes, completions, refusals, calls atomic.Uint64
	naps                                 atomic.Uint64 // times its pump was paced, see pump.share
	ringCalls                            atomic.Uint64 // control SQEs run (Connect on the ring)

	// lat is the time of its requests by class (reqClass), from the pump
	// taking them off a ring to their completions posted; the pump writes
	// it under its lock.
	lat [reqClasses]latency
}

func newSession(s *Server, c *net.UnixConn, cred *unix.Ucred) *session {
	ss := &session{s: s, id: s.ids.Add(1), conn: c, cred: cred, mrs: make(map[uint64]*memory),
		regions: make(map[uint64]krcore.Region), vqs: make(map[uint64]*vq), exports: make(map[string]uint64),
		reports: make(map[string]storedReport)}
	ss.ctx, ss.cancel = context.WithCancel(s.ctx)
	ss.pump = newPump(ss)
	ss.remote = make(chan struct{}, maxRemoteCalls)
	return ss
}

// maxRemoteCalls is how many calls that wait for other nodes one client
// may have running beside serve's loop; more run in the loop, in turn.
const maxRemoteCalls = 4

// waitsForPeers reports whether m waits for another node's answer: an
// OpQueue does when its body asks for a connect (FeatureQueueTo).
func waitsForPeers(m *wire.Msg) bool {
	switch m.Op {
	case wire.OpRegion, wire.OpVQRegion, wire.OpConnect:
		return true
	case wire.OpQueue:
		return m.More()
	}
	return false
}

// serve answers the client's requests until its socket closes, then
// reclaims what it owned.
func (ss *session) serve() {
	go ss.pump.run()
	defer ss.reclaim()
	rx := wire.NewReceiver(ss.conn)
	defer rx.Release()
	for {
		m, err := rx.Recv()
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				return // gone: EOF, reset, or closed by bye
			}
			ss.refusals.Add(1)
			ss.s.log.Warn("malformed control message", "client", ss.id, "err", err)
			continue
		}
		ss.calls.Add(1)
		if ss.attached && waitsForPeers(m) && ss.startRemote(m) {
			continue
		}
		if err := ss.answer(m); err != nil {
			return
		}
	}
}

// answer runs m and sends its response.
func (ss *session) answer(m *wire.Msg) error {
	resp := ss.handle(m)
	m.CloseFDs() // whatever the handler did not keep
	return ss.send(resp)
}

// startRemote answers m in a goroutine of its own, if fewer than
// maxRemoteCalls run, and reports whether it did. The client matches
// responses to calls by sequence number, so they may come in any order;
// a client's calls that depend on each other wait for each other's
// answers. reclaim waits for these goroutines; ss.ctx, which ends first,
// bounds their waits.
func (ss *session) startRemote(m *wire.Msg) bool {
	select {
	case ss.remote <- struct{}{}:
	default:
		return false
	}
	ss.remoteCall.Go(func() {
		defer func() { <-ss.remote }()
		ss.answer(m) // a send failing means the client is gone: serve sees it too
	})
	return true
}

// send sends m to the client, waiting at most Config.SendTimeout for room
// in its socket. A send that fails closes the connection: serve's loop
// then ends and the client is reclaimed, so a client that stops reading
// holds no goroutine of the daemon.
func (ss *session) send(m *wire.Msg) error {
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	ss.conn.SetWriteDeadline(time.Now().Add(ss.s.cfg.SendTimeout))
	err := wire.Send(ss.conn, m)
	if err != nil {
		ss.conn.Close()
	}
	return err
}

// bye tells the client the daemon is going, then drops it.
func (ss *session) bye(reason string) {
	ss.send(wire.NewMsg(wire.OpBye, 0).Str(reason))
	ss.conn.Close()
}

// handle runs one request and returns its response. OpHello comes first,
// and once.
func (ss *session) handle(m *wire.Msg) *wire.Msg {
	r := m.Reply()
	var err error
	switch {
	case m.Op == wire.OpHello && ss.attached:
		err = fmt.Errorf("HELLO twice: %w", verbs.ErrInvalid)
	case m.Op != wire.OpHello && !ss.attached:
		err = fmt.Errorf("op %d before HELLO: %w", m.Op, verbs.ErrInvalid)
	case m.Op == wire.OpHello:
		if err = ss.hello(m, r); err == nil {
			ss.attached = true
		}
	default:
		err = ss.handleOp(m, r)
	}
	if err != nil {
		if errors.Is(err, krcore.ErrRefused) || errors.Is(err, verbs.ErrInvalid) {
			ss.refusals.Add(1)
		}
		return r.Fail(err)
	}
	return r
}

// handleOp runs an attached client's request other than OpHello.
func (ss *session) handleOp(m *wire.Msg, r *wire.Msg) error {
	switch m.Op {
	case wire.OpRegister:
		return ss.register(m, r)
	case wire.OpDeregister:
		return ss.deregister(m.GetU64(), m.Err())
	case wire.OpExport:
		return ss.export(m)
	case wire.OpUnexport:
		return ss.unexport(m.GetStr(), m.Err())
	case wire.OpRegion:
		return ss.region(m, r)
	case wire.OpQueue:
		return ss.queue(m, r)
	case wire.OpConnect, wire.OpBind, wire.OpUnbind, wire.OpCloseVQ, wire.OpVQRegion:
		return ss.vqCall(m, r)
	case wire.OpStats:
		wire.PutStats(r, ss.s.rt.Stats())
		return nil
	case wire.OpStatus:
		return ss.status(r)
	case wire.OpReport:
		return ss.report(m)
	case wire.OpReports:
		return ss.listReports(m, r)
	case wire.OpForget:
		return ss.forget(m.GetU64(), m.Err())
	default:
		return fmt.Errorf("unknown op %d: %w", m.Op, verbs.ErrInvalid)
	}
}

func (ss *session) hello(m *wire.Msg, r *wire.Msg) error {
	if v := m.GetU32(); m.Err() != nil || v != wire.Version {
		return fmt.Errorf("protocol version %d, daemon speaks %d: %w", v, wire.Version, verbs.ErrInvalid)
	}
	st := ss.s.rt
	cfg := ss.s.rt.Config()
	r.U64(ss.id).U64(st.Node()).U32(uint32(cfg.Credits)).U32(uint32(cfg.MaxMessage)).U32(wire.Features)
	return nil
}

// register maps the client's memfd and registers the range it names.
func (ss *session) register(m *wire.Msg, r *wire.Msg) error {
	off, n, access := m.GetU64(), m.GetU64(), verbs.Access(m.GetU32())
	if err := m.Err(); err != nil || len(m.FDs) != 1 {
		return fmt.Errorf("register: want one memfd: %w", verbs.ErrInvalid)
	}
	if n == 0 || off > 1<<40 || n > 1<<40 {
		return fmt.Errorf("register [%d,+%d): %w", off, n, verbs.ErrInvalid)
	}
	ss.mu.Lock()
	over := ss.mrBytes+int64(n) > ss.s.cfg.MaxMRBytes
	if !over {
		ss.mrBytes += int64(n)
	}
	ss.mu.Unlock()
	if over {
		return fmt.Errorf("register %d bytes: client limit %d: %w", n, ss.s.cfg.MaxMRBytes, verbs.ErrLimit)
	}
	mem, err := ss.mapAndRegister(&m.FDs[0], off, n, access)
	if err != nil {
		ss.mu.Lock()
		ss.mrBytes -= int64(n)
		ss.mu.Unlock()
		return err
	}
	id := ss.s.ids.Add(1)
	ss.mu.Lock()
	ss.mrs[id] = mem
	ss.mu.Unlock()
	r.U64(id)
	return nil
}

// mapAndRegister maps the memfd at *fd and registers [off, off+n) of it.
// Once the mapping owns the memfd, *fd becomes -1: the message's
// descriptors are closed after the call, and a failure past that point
// closes the memfd with the mapping, so closing it again could close a
// descriptor another goroutine has opened since under the same number.
func (ss *session) mapAndRegister(fd *int, off, n uint64, access verbs.Access) (*memory, error) {
	blk, err := offheap.OpenSealed(*fd, int(off+n))
	if err != nil {
		return nil, fmt.Errorf("register: %w: %w", err, verbs.ErrInvalid)
	}
	*fd = -1
	mr, err := ss.s.rt.Register(blk.Bytes()[off:off+n], access)
	if err != nil {
		blk.Close()
		return nil, err
	}
	return &memory{mr: mr, blk: blk}, nil
}

func (ss *session) deregister(id uint64, err error) error {
	if err != nil {
		return err
	}
	ss.mu.Lock()
	mem := ss.mrs[id]
	delete(ss.mrs, id)
	if mem != nil {
		ss.mrBytes -= int64(mem.mr.Len())
		// The runtime's Deregister withdraws the MR's exports: the names
		// are no longer this client's, and may soon be another's.
		maps.DeleteFunc(ss.exports, func(_ string, mr uint64) bool { return mr == id })
	}
	ss.mu.Unlock()
	if mem == nil {
		return fmt.Errorf("deregister MR %d: not this client's: %w", id, krcore.ErrRefused)
	}
	return mem.release(ss.s)
}

// release deregisters the MR and unmaps its memory. The runtime's
// Deregister waits for the requests that use the MR; when some are still
// in flight as it gives up (verbs.ErrBusy) the runtime deregisters the MR
// when they finish, and the memory stays mapped: a posted request may
// still move bytes into or out of it, so it is never unmapped under one.
// Such a block is kept (Server.stranded) until the daemon exits.
func (mem *memory) release(s *Server) error {
	err := s.rt.Deregister(mem.mr)
	if errors.Is(err, verbs.ErrBusy) {
		s.strand(mem.blk)
		return err
	}
	if cerr := mem.blk.Close(); err == nil {
		err = cerr
	}
	return err
}

// mr is the client's MR id, or nil.
func (ss *session) mr(id uint64) *memory {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	return ss.mrs[id]
}

func (ss *session) export(m *wire.Msg) error {
	name, id, off, n, access := m.GetStr(), m.GetU64(), m.GetU64(), m.GetU64(), verbs.Access(m.GetU32())
	if err := m.Err(); err != nil {
		return err
	}
	mem := ss.mr(id)
	if mem == nil {
		return fmt.Errorf("export %q of MR %d: not this client's: %w", name, id, krcore.ErrRefused)
	}
	if off > 1<<40 || n > 1<<40 {
		return fmt.Errorf("export %q [%d,+%d): %w", name, off, n, verbs.ErrInvalid)
	}
	to, err := audience(m)
	if err != nil {
		return fmt.Errorf("export %q: %w", name, err)
	}
	if err := ss.s.rt.Export(name, mem.mr, int(off), int(n), access, to...); err != nil {
		return err
	}
	ss.mu.Lock()
	ss.exports[name] = id
	ss.mu.Unlock()
	return nil
}

// audience reads an OpExport's optional audience; the runtime checks
// the principals.
func audience(m *wire.Msg) ([]krcore.Principal, error) {
	if !m.More() {
		return nil, nil
	}
	k := m.GetU32()
	if k > krcore.MaxAudience {
		return nil, fmt.Errorf("audience of %d principals, more than %d: %w", k, krcore.MaxAudience, verbs.ErrLimit)
	}
	to := make([]krcore.Principal, k)
	for i := range to {
		to[i] = krcore.Principal{Node: m.GetU64(), Port: m.GetU32()}
	}
	return to, m.Err()
}

// unexport withdraws an export the client made (OpUnexport).
func (ss *session) unexport(name string, err error) error {
	if err != nil {
		return err
	}
	if _, mine := take(ss, ss.exports, name); !mine {
		return fmt.Errorf("unexport %q: not exported by this client: %w", name, krcore.ErrRefused)
	}
	return ss.s.rt.Unexport(name)
}

func (ss *session) region(m *wire.Msg, r *wire.Msg) error {
	node, name := m.GetU64(), m.GetStr()
	if err := m.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ss.ctx, ss.s.cfg.CallTimeout)
	defer cancel()
	g, err := ss.s.rt.Region(ctx, node, name)
	if err != nil {
		return err
	}
	ss.addRegion(g, r)
	r.U64(0) // reserved: the address stays here with the rkey
	return nil
}

// vqRegion answers OpVQRegion: the lookup asks as the port v holds bound,
// the only port a client can ask as, so an export to an audience reaches
// only the client whose queue holds the principal's port.
func (ss *session) vqRegion(ctx context.Context, v *vq, name string, r *wire.Msg) error {
	g, err := v.q.Region(ctx, name)
	if err != nil {
		return err
	}
	ss.addRegion(g, r)
	r.U64(g.Node())
	return nil
}

// addRegion keeps g as the client's and puts its id, length and access in
// the reply r.
func (ss *session) addRegion(g krcore.Region, r *wire.Msg) {
	id := ss.s.ids.Add(1)
	ss.mu.Lock()
	ss.regions[id] = g
	ss.mu.Unlock()
	r.U64(id).U64(g.Len()).U32(uint32(g.Access()))
}

// forget drops a region the client learned (OpForget), whose entry
// would otherwise stay until the client detaches. Requests taken off the
// client's rings before hold the region itself and go on.
func (ss *session) forget(id uint64, err error) error {
	if err != nil {
		return err
	}
	if _, mine := take(ss, ss.regions, id); !mine {
		return fmt.Errorf("forget region %d: not this client's: %w", id, krcore.ErrRefused)
	}
	return nil
}

// regionByID is the client's region, or nil.
func (ss *session) regionByID(id uint64) krcore.Region {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	return ss.regions[id]
}

// queue makes a VQ over the ring memfd and bells the client sent.
func (ss *session) queue(m *wire.Msg, r *wire.Msg) error {
	if len(m.FDs) != 4 && len(m.FDs) != 5 {
		return fmt.Errorf("queue: want 4 or 5 descriptors, got %d: %w", len(m.FDs), verbs.ErrInvalid)
	}
	ss.mu.RLock()
	n := len(ss.vqs)
	ss.mu.RUnlock()
	if n >= ss.s.cfg.MaxVQs {
		return fmt.Errorf("queue: client limit of %d VQs: %w", ss.s.cfg.MaxVQs, verbs.ErrLimit)
	}
	v, err := newVQ(ss, m.FDs)
	if err != nil {
		return err
	}
	m.FDs = nil
	// Counted again as it joins: OpQueues that connect run beside each
	// other (startRemote), so others may have joined since the check
	// above, which only spares a client over its limit the mappings.
	ss.mu.Lock()
	over := len(ss.vqs) >= ss.s.cfg.MaxVQs
	if !over {
		ss.vqs[v.id] = v
	}
	ss.mu.Unlock()
	if over {
		v.close()
		return fmt.Errorf("queue: client limit of %d VQs: %w", ss.s.cfg.MaxVQs, verbs.ErrLimit)
	}
	v.start()
	if !m.More() {
		r.U64(v.id)
		return nil
	}
	g, err := ss.dial(v, m)
	if err != nil {
		ss.closeVQ(v.id)
		return err
	}
	r.U64(v.id)
	if g != nil {
		ss.addRegion(g, r)
		r.U64(g.Node())
	}
	return nil
}

// dial connects a new queue and looks a region up, as the body of an
// OpQueue asks (FeatureQueueTo): a newcomer's Queue, Connect and Region in
// one round trip. Both wait for other nodes and neither needs the other
// (the new queue holds no port, so the lookup asks as none, as its
// OpVQRegion would), so they run at once. The region is nil without a
// name.
func (ss *session) dial(v *vq, m *wire.Msg) (krcore.Region, error) {
	node, toPort, port, name := m.GetU64(), m.GetU8(), m.GetU32(), m.GetStr()
	if err := m.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ss.ctx, ss.s.cfg.CallTimeout)
	defer cancel()
	var opts krcore.ConnectOptions
	if toPort != 0 {
		opts.Port = port
	}
	var g krcore.Region
	var rerr error
	var wg sync.WaitGroup
	if name != "" {
		wg.Go(func() {
			if cg, err := ss.s.rt.Region(ctx, node, name); err != nil {
				rerr = err
			} else {
				g = cg
			}
		})
	}
	cerr := v.connect(ctx, node, &opts)
	wg.Wait()
	if err := errors.Join(cerr, rerr); err != nil {
		return nil, err
	}
	return g, nil
}

// closeVQ forgets the client's VQ id and closes it.
func (ss *session) closeVQ(id uint64) {
	if v, _ := take(ss, ss.vqs, id); v != nil {
		v.close()
	}
}

// take removes k from m, one of ss's maps (guarded by ss.mu), and returns
// what it held.
func take[K comparable, V any](ss *session, m map[K]V, k K) (V, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	v, ok := m[k]
	delete(m, k)
	return v, ok
}

// vqCall runs the control requests addressed to one VQ.
func (ss *session) vqCall(m *wire.Msg, r *wire.Msg) error {
	id := m.GetU64()
	ss.mu.RLock()
	v := ss.vqs[id]
	ss.mu.RUnlock()
	if v == nil {
		return fmt.Errorf("VQ %d: not this client's: %w", id, krcore.ErrRefused)
	}
	switch m.Op {
	case wire.OpConnect:
		node, toPort, port := m.GetU64(), m.GetU8(), m.GetU32()
		if err := m.Err(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ss.ctx, ss.s.cfg.CallTimeout)
		defer cancel()
		var opts krcore.ConnectOptions
		if toPort != 0 {
			opts.Port = port
		}
		return v.connect(ctx, node, &opts)
	case wire.OpBind:
		port := m.GetU32()
		if err := m.Err(); err != nil {
			return err
		}
		return v.bind(port)
	case wire.OpUnbind:
		v.q.Unbind()
		return nil
	case wire.OpVQRegion:
		name := m.GetStr()
		if err := m.Err(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ss.ctx, ss.s.cfg.CallTimeout)
		defer cancel()
		return ss.vqRegion(ctx, v, name, r)
	default: // OpCloseVQ
		ss.closeVQ(id)
		return nil
	}
}

// reclaim releases everything the client owned; it runs once, when the
// client's socket closed for whatever reason. The order matters to the
// other clients, whose requests share the client's QPs: first no more of
// its requests reach the runtime (the pump stops), then its requests
// already on shared QPs finish (drain), and only then are its VQs closed
// and its MRs deregistered and unmapped. Deregistering under a posted
// request would fail it on the shared QP, and unmapping under it would
// have the RNIC write into memory that is gone.
func (ss *session) reclaim() {
	ss.cancel()
	ss.remoteCall.Wait()
	<-ss.pump.done
	ss.conn.Close()
	ss.mu.Lock()
	vqs, mrs, exports := ss.vqs, ss.mrs, ss.exports
	ss.vqs, ss.mrs, ss.exports, ss.regions = map[uint64]*vq{}, map[uint64]*memory{}, map[string]uint64{}, map[uint64]krcore.Region{}
	ss.mrBytes = 0
	ss.mu.Unlock()
	if err := ss.pump.drain(vqs); err != nil {
		ss.s.log.Warn("reclaim: requests still in flight", "client", ss.id, "err", err)
	}
	for _, v := range vqs {
		v.close()
	}
	for name := range exports {
		ss.s.rt.Unexport(name)
	}
	for _, mem := range mrs {
		if err := mem.release(ss.s); err != nil {
			ss.s.log.Warn("reclaim MR", "client", ss.id, "err", err)
		}
	}
	ss.s.log.Info("client reclaimed", "client", ss.id, "pid", ss.cred.Pid, "vqs", len(vqs), "mrs", len(mrs))
}
