package udrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// GRHLen is the Global Routing Header that starts every UD receive.
const GRHLen = 40

// Sentinel errors.
var (
	// ErrClosed: the endpoint was closed (Config.Closed replaces it).
	ErrClosed = errors.New("udrpc: closed")
	// ErrNoReply: no reply came within the attempts.
	ErrNoReply = errors.New("udrpc: no reply")
	// ErrTooLong: a message exceeds Config.MaxMsg.
	ErrTooLong = errors.New("udrpc: message too long")
)

// Config configures an Endpoint. Zero fields take the defaults.
type Config struct {
	// QKey is the queue key the endpoint takes, and the one it sends with
	// when a Dest names none.
	QKey uint32
	// Depth is the number of receive buffers and of send buffers; default 16.
	Depth int
	// MaxMsg is the largest message sent or received; default 512. It must
	// fit the path MTU.
	MaxMsg int
	// Timeout is a call's first wait for its reply; each retry doubles it,
	// up to 16x. Default 50ms.
	Timeout time.Duration
	// Attempts is how often a call is sent before ErrNoReply; default 6.
	Attempts int
	// ReplyID tells replies from requests: for a reply it returns the id of
	// the call it answers and true. Required.
	ReplyID func(msg []byte) (uint64, bool)
	// OnRequest gets a copy of every message that is not a reply. It runs
	// in whichever goroutine polls the endpoint and must not block; nil
	// drops requests (a pure client).
	OnRequest func(msg []byte)
	// Closed is the error calls fail with once the endpoint closes; default
	// ErrClosed.
	Closed error
}

func (c Config) withDefaults() Config {
	if c.Depth <= 0 {
		c.Depth = 16
	}
	if c.MaxMsg <= 0 {
		c.MaxMsg = 512
	}
	if c.Timeout <= 0 {
		c.Timeout = 50 * time.Millisecond
	}
	if c.Attempts <= 0 {
		c.Attempts = 6
	}
	if c.Closed == nil {
		c.Closed = ErrClosed
	}
	return c
}

// Dest is where a message goes: the address handle of the peer's port,
// its UD QP number and the QKey it takes (0: Config.QKey).
type Dest struct {
	AH   verbs.AH
	QPN  uint32
	QKey uint32
}

// Work request ids: kind<<56 | generation<<32 | buffer index.
const (
	kindSend = 1
	kindRecv = 2
)

func wrID(kind, gen uint32, idx int) uint64 {
	return uint64(kind)<<56 | uint64(gen)<<32 | uint64(uint32(idx))
}

// call is a request waiting for its reply.
type call struct {
	ready chan struct{} // capacity 1
	rep   []byte
}

// Endpoint is a UD QP, its CQ and buffers, for request/reply exchanges:
// Call sends a request and waits for the reply with the same id, retrying
// with a doubling timeout since UD may drop a datagram. Requests from
// peers go to Config.OnRequest. No goroutine polls it: callers (and the
// owner's serving goroutine, through Wait) take turns (see Poller).
type Endpoint struct {
	cfg  Config
	cq   verbs.CQ
	mem  *offheap.Block
	mr   verbs.MR
	poll *Poller

	mu  sync.RWMutex // held shared to post, exclusively to recover the QP
	qp  verbs.QP
	gen atomic.Uint32 // the QP's incarnation; stale receives are ignored

	txFree chan int
	txKick chan struct{} // a token: a send buffer came back to txFree

	pendMu  sync.Mutex
	pending map[uint64]*call

	stop     chan struct{}
	stopOnce sync.Once
	closed   atomic.Bool
}

// New creates an endpoint on pd (of dev) with every receive posted.
func New(dev verbs.Device, pd verbs.PD, cfg Config) (*Endpoint, error) {
	cfg = cfg.withDefaults()
	if cfg.ReplyID == nil {
		return nil, fmt.Errorf("udrpc: config needs ReplyID: %w", verbs.ErrInvalid)
	}
	e := &Endpoint{cfg: cfg, txFree: make(chan int, cfg.Depth), txKick: make(chan struct{}, 1),
		pending: make(map[uint64]*call), stop: make(chan struct{})}
	if err := e.setup(dev, pd); err != nil {
		return nil, errors.Join(fmt.Errorf("udrpc: new endpoint: %w", err), e.Close())
	}
	return e, nil
}

func (e *Endpoint) setup(dev verbs.Device, pd verbs.PD) error {
	var err error
	d := e.cfg.Depth
	// Room for the work of several incarnations: a QP recovered after an
	// error leaves its flushed completions behind until the next poll.
	if e.cq, err = dev.CreateCQ(4 * 2 * d); err != nil {
		return err
	}
	e.poll = NewPoller(e.cq, e.stop, e.cfg.Closed, e.handle)
	if e.mem, err = offheap.Alloc(d * (e.recvLen() + e.cfg.MaxMsg)); err != nil {
		return err
	}
	if e.mr, err = pd.RegMR(e.mem.Bytes(), verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := range d {
		e.txFree <- i
	}
	e.qp, err = pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: d, MaxRecvWR: d, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("create UD QP: %w", err)
	}
	return e.ready(e.gen.Add(1))
}

// ready brings the QP from RESET to RTS as incarnation gen, with every
// receive buffer posted.
func (e *Endpoint) ready(gen uint32) error {
	err := verbs.Ready(e.qp, verbs.Path{QKey: e.cfg.QKey, Timeout: e.cfg.Timeout, RetryCount: -1})
	for i := 0; err == nil && i < e.cfg.Depth; i++ {
		err = e.postRecv(gen, i)
	}
	return err
}

func (e *Endpoint) recvLen() int { return GRHLen + e.cfg.MaxMsg }

func (e *Endpoint) recvOff(i int) int { return i * e.recvLen() }

func (e *Endpoint) txOff(i int) int { return e.cfg.Depth*e.recvLen() + i*e.cfg.MaxMsg }

func (e *Endpoint) postRecv(gen uint32, i int) error {
	wr := verbs.RecvWR{ID: wrID(kindRecv, gen, i), SGL: []verbs.SGE{verbs.SGEOf(e.mr, e.recvOff(i), e.recvLen())}}
	_, err := e.qp.PostRecv([]verbs.RecvWR{wr})
	return err
}

// QPN is the endpoint's UD QP number, where peers send. It never changes:
// recovery resets the QP in place.
func (e *Endpoint) QPN() uint32 { return e.qp.Num() }

// Wait polls the endpoint (or waits for the goroutine polling it) until a
// token arrives on ready: how an owner serving OnRequest waits for work.
func (e *Endpoint) Wait(ctx context.Context, ready <-chan struct{}) error {
	return e.poll.Wait(ctx, ready)
}

// handle dispatches one completion; the poller's leader calls it.
func (e *Endpoint) handle(wc *verbs.WC) {
	kind, gen, idx := uint32(wc.ID>>56), uint32(wc.ID>>32)&0xffffff, int(uint32(wc.ID))
	switch {
	case kind == kindSend && idx < e.cfg.Depth:
		e.putTx(idx)
	case kind == kindRecv && idx < e.cfg.Depth:
		e.onRecv(gen, idx, wc)
	}
}

// onRecv delivers a message and reposts its buffer. Receives of an older
// incarnation are ignored: their buffers were posted again to the new one.
// A failed receive of this incarnation on a QP in ERR means the QP broke
// under its receives: it is recovered here, since an endpoint that only
// answers requests never sends (which recovers it too) and would never
// hear again.
func (e *Endpoint) onRecv(gen uint32, i int, wc *verbs.WC) {
	if gen != e.gen.Load() {
		return
	}
	if wc.Status != verbs.Success && e.qp.State() == verbs.StateErr {
		e.recover() // a failure leaves it in ERR for the next Send to retry
		return
	}
	if wc.Status == verbs.Success && int(wc.ByteLen) > GRHLen {
		off := e.recvOff(i)
		e.dispatch(e.mr.Bytes()[off+GRHLen : off+int(wc.ByteLen)])
	}
	e.mu.RLock()
	if gen == e.gen.Load() {
		e.postRecv(gen, i) // fails only once the QP is in ERR; recovery reposts
	}
	e.mu.RUnlock()
}

// dispatch hands a received message to its call or to OnRequest.
func (e *Endpoint) dispatch(msg []byte) {
	id, isReply := e.cfg.ReplyID(msg)
	if !isReply {
		if e.cfg.OnRequest != nil {
			e.cfg.OnRequest(append([]byte(nil), msg...))
		}
		return
	}
	e.pendMu.Lock()
	defer e.pendMu.Unlock()
	if cl := e.pending[id]; cl != nil {
		delete(e.pending, id)
		cl.rep = append([]byte(nil), msg...)
		cl.ready <- struct{}{}
	}
}

// silentAttempts is how many whole attempts must go unanswered before a
// call that its context's deadline ends reports ErrNoReply too.
const silentAttempts = 3

// Call sends msg, a request with the given id, to to and returns the
// reply, sending again with a doubling timeout while none comes. Every
// copy carries the same id, so a peer can answer a copy without acting
// twice. A call whose context's deadline comes after silentAttempts whole
// attempts went unanswered fails with an error matching both ErrNoReply
// and context.DeadlineExceeded: the peer was silent, not merely slow to
// be asked.
func (e *Endpoint) Call(ctx context.Context, to Dest, id uint64, msg []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		// A reply can be back before the first wait looks at ctx: a
		// call whose context is done must not be sent at all.
		return nil, err
	}
	timeout := e.cfg.Timeout
	var last error
	for i := range e.cfg.Attempts {
		actx, cancel := context.WithTimeout(ctx, timeout)
		rep, err := e.roundTrip(actx, to, id, msg)
		cancel()
		if err == nil {
			return rep, nil
		}
		if ctx.Err() != nil && i >= silentAttempts && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w in %d attempts before the deadline: %w", ErrNoReply, i, ctx.Err())
		}
		if ctx.Err() != nil || errors.Is(err, e.cfg.Closed) || errors.Is(err, ErrTooLong) {
			return nil, err
		}
		last = err
		timeout = min(2*timeout, 16*e.cfg.Timeout)
	}
	return nil, fmt.Errorf("%w in %d attempts (last: %v)", ErrNoReply, e.cfg.Attempts, last)
}

// roundTrip is one attempt of a call.
func (e *Endpoint) roundTrip(ctx context.Context, to Dest, id uint64, msg []byte) ([]byte, error) {
	cl := &call{ready: make(chan struct{}, 1)}
	e.pendMu.Lock()
	e.pending[id] = cl
	e.pendMu.Unlock()
	err := e.Send(ctx, to, msg)
	if err == nil {
		err = e.poll.Wait(ctx, cl.ready)
	}
	if err != nil {
		e.pendMu.Lock()
		mine := e.pending[id] == cl
		if mine {
			delete(e.pending, id)
		}
		e.pendMu.Unlock()
		if mine {
			return nil, err
		}
		<-cl.ready // the reply was delivered as we gave up
	}
	return cl.rep, nil
}

// Send posts one datagram to to (a reply, or a request nobody waits on),
// recovering the QP first if an earlier send broke it.
func (e *Endpoint) Send(ctx context.Context, to Dest, msg []byte) error {
	if len(msg) > e.cfg.MaxMsg {
		return fmt.Errorf("%w: %d bytes, max %d", ErrTooLong, len(msg), e.cfg.MaxMsg)
	}
	i, err := e.txBuffer(ctx)
	if err != nil {
		return err
	}
	e.mu.RLock()
	if e.qp.State() == verbs.StateErr && !e.closed.Load() {
		e.mu.RUnlock()
		if err := e.recover(); err != nil {
			e.putTx(i)
			return err
		}
		e.mu.RLock()
	}
	defer e.mu.RUnlock()
	if e.closed.Load() { // Close may be releasing the buffers
		e.putTx(i)
		return e.cfg.Closed
	}
	off := e.txOff(i)
	copy(e.mr.Bytes()[off:], msg)
	qkey := to.QKey
	if qkey == 0 {
		qkey = e.cfg.QKey
	}
	wr := verbs.SendWR{
		ID: wrID(kindSend, 0, i), Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: []verbs.SGE{verbs.SGEOf(e.mr, off, len(msg))}, AH: to.AH, RemoteQPN: to.QPN, QKey: qkey,
	}
	if _, err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		e.putTx(i)
		return fmt.Errorf("udrpc: post to QP %d: %w", to.QPN, err)
	}
	return nil
}

// txBuffer takes a free send buffer. Buffers come back as their send
// completions are polled, so while none is free it polls the endpoint
// itself (or waits for whoever does): a goroutine that only sends (the
// owner answering a burst of requests) would otherwise wait for a poll
// that nobody makes.
func (e *Endpoint) txBuffer(ctx context.Context) (int, error) {
	for {
		select {
		case i := <-e.txFree:
			if len(e.txFree) > 0 {
				e.kickTx() // the token this sender took may have stood for more
			}
			return i, nil
		case <-e.stop:
			return 0, e.cfg.Closed
		default:
		}
		if err := e.poll.Wait(ctx, e.txKick); err != nil {
			return 0, err
		}
	}
}

// putTx returns send buffer i and tells a sender waiting for one.
func (e *Endpoint) putTx(i int) {
	e.txFree <- i
	e.kickTx()
}

// kickTx tells a sender waiting in txBuffer to look at txFree again.
func (e *Endpoint) kickTx() {
	select {
	case e.txKick <- struct{}{}:
	default:
	}
}

// recover brings a QP that went to ERR (a datagram to an unreachable port)
// back in place, keeping its number, which peers know. Its receives were
// flushed; the new incarnation posts them again.
func (e *Endpoint) recover() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.qp.State() != verbs.StateErr || e.closed.Load() {
		return nil
	}
	gen := e.gen.Add(1)
	if err := e.qp.Modify(verbs.QPAttr{State: verbs.StateReset}); err != nil {
		return fmt.Errorf("udrpc: reset UD QP %d: %w", e.qp.Num(), err)
	}
	if err := e.ready(gen); err != nil {
		return fmt.Errorf("udrpc: ready UD QP %d again: %w", e.qp.Num(), err)
	}
	return nil
}

// Shutdown fails every call and wait, now and later, with Config.Closed
// and moves the QP to ERR: the first step of closing an owner whose
// goroutines may be waiting on the endpoint.
func (e *Endpoint) Shutdown() {
	e.stopOnce.Do(func() { close(e.stop) })
	e.mu.Lock()
	e.closed.Store(true)
	if e.qp != nil {
		e.qp.Modify(verbs.QPAttr{State: verbs.StateErr})
	}
	e.mu.Unlock()
}

// Close shuts the endpoint down and releases its resources. A goroutine
// still in a call may be leading the poller, handling a message in a
// receive buffer, or copying a request into a send buffer: Close waits
// for it to leave them (the leader leaves within its wait's context, at
// most one attempt's timeout for a call), and no one enters them again.
func (e *Endpoint) Close() error {
	e.Shutdown()
	if e.poll != nil {
		e.poll.Retire()
	}
	e.mu.Lock() // no sender is copying into a send buffer
	defer e.mu.Unlock()
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Close())
	}
	if e.mr != nil {
		errs = append(errs, e.mr.Close())
	}
	if e.mem != nil {
		errs = append(errs, e.mem.Close())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Close())
	}
	return errors.Join(errs...)
}
