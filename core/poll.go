package core

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// recvBit marks the wr_id of the runtime's shared receives.
const recvBit = 1 << 63

// spinFor is how long a waiter polls before it sleeps: long enough to catch
// a completion that is microseconds away, short enough not to hold a core
// that the provider's own goroutines (a link reader) need on a two-core
// machine. While spinning it yields now and then, so a goroutine it woke
// (a peer in the same process) gets to run.
const spinFor = 5 * time.Microsecond

// poller is one of the node's two completion queues (sends, receives) with
// the state of those who poll and wait on it. Separate queues keep a
// goroutine waiting for messages from being woken by every data-plane
// completion.
type poller struct {
	rt  *Runtime
	cq  verbs.CQ
	mu  sync.Mutex // held while polling
	wcs []verbs.WC
	fin []finished
	// lastMap, lastQPN and lastPQP remember the last QP a completion
	// came from (see pqpOf); guarded by mu.
	lastMap *map[uint32]*pqp
	lastQPN uint32
	lastPQP *pqp
	// dispatched counts the completions polled so far; guarded by mu
	// (see rester).
	dispatched uint64

	waitMu  sync.Mutex      // the role of sleeping on the CQ, see wait
	sctx    context.Context // the role's sleep context, see sleepOnCQ
	scancel context.CancelFunc
	// cancelMu guards scancel against cancelSleep, which the end of a
	// watched context runs on its own goroutine.
	cancelMu sync.Mutex
	// onDone is cancelSleep as one func value for every registration
	// (see watch).
	onDone func()
	// lastRole is the holder the last sleep on the CQ published, for
	// the next to publish again; guarded by waitMu.
	lastRole *roleHolder
	wdone    <-chan struct{} // the context whose end cancels sctx, see watch
	wstop    func() bool
	role     atomic.Pointer[roleHolder]
	wake     chan struct{}
	failed   atomic.Bool   // the CQ failed (device gone); logged once
	sleeps   atomic.Uint64 // sleeps on the CQ (CQ.Wait calls), for tests
	// readiedSeen is the runtime's readied count the last sleep on the
	// CQ saw (see sleepOnCQ); guarded by waitMu.
	readiedSeen uint64

	spinScore atomic.Int32  // see spins
	spinWaits atomic.Uint32 // waits that did not spin, for probing
	noSpin    bool          // the device progresses in CQ.Wait: never spin
	// quiet is the CQ if it tells when a poll would find nothing to do
	// (quietCQ): a poll then takes no lock.
	quiet quietCQ
	// own stands for the runtime's own waiter (see serveRecvs): it never
	// displaces another waiter, and any waiter displaces it.
	own *Queue
	// ownTimer bounds serveRecvs's waits aside (ownAside); only it uses it.
	ownTimer *time.Timer
	// asleep counts goroutines asleep in waitReady; ownLazy (the receive
	// poller's) says serveRecvs waits aside lazily (ownAside).
	asleep  atomic.Int32
	ownLazy atomic.Bool
	// asideTok counts waiters asleep aside that take the hand-over
	// token (sleepAside); lent says the last sleeper on the completion
	// queue left with what it waited for and lends the role (lend), which
	// lendTimer ends after lendFor.
	asideTok  atomic.Int32
	lent      atomic.Bool
	lendTimer *time.Timer
	// alone is cq if it tells whether its completions come without a
	// waiter (see lends), else nil.
	alone progressesAlone
}

func newPoller(rt *Runtime, entries int) (*poller, error) {
	cq, err := rt.dev.CreateCQ(min(entries, rt.dev.Attr().MaxCQE))
	if err != nil {
		return nil, err
	}
	pl := &poller{rt: rt, cq: cq, wcs: make([]verbs.WC, 64), wake: make(chan struct{}, 1),
		noSpin: rt.dev.Attr().ProgressInWait}
	pl.quiet, _ = cq.(quietCQ)
	pl.onDone = pl.cancelSleep
	pl.lendTimer = time.AfterFunc(time.Hour, pl.endLend)
	pl.lendTimer.Stop()
	pl.alone, _ = cq.(progressesAlone)
	return pl, nil
}

// poll drains the completion queue and dispatches every completion to the
// VQ it belongs to. Whoever calls it does the work; if another goroutine is
// already polling it returns at once.
func (pl *poller) poll() int {
	return pl.pollFor(nil, nil, nil)
}

// ownRun is the outcomes of one queue's requests that a poll hands back
// to the queue's Pop instead of finishing them (see pollFor): one by one
// in fs, and successes of consecutive sequence numbers as one range (a
// stream's signaled completion retires the unsignaled requests before it:
// see completeRun). An array in a struct, filled element by element: a
// slice appended to down the poll path made the caller's array escape,
// one allocation per Pop.
type ownRun struct {
	fs [8]outcome
	n  int
	// span successes from sequence number lo; their lengths are their
	// entries' (entry.n).
	lo   uint64
	span int
}

// outcome is a finished request of the queue an ownRun is for.
type outcome struct {
	seq    uint64
	n      uint32
	status verbs.Status
}

// ownMsgs takes the messages to a queue's port that a poll of the receive
// queue finds while the queue holds none, for the queue's PopMsgs that
// polls (see receiver.onWC).
type ownMsgs struct {
	out []krcore.Message
	n   int
}

// quietCQ is a CQ that can tell, with loads only, that a Poll now would
// return nothing and do nothing (the soft RNIC's in-memory wire). A poll
// of such a CQ takes no lock then: a goroutine spinning on an empty CQ
// (a ping-pong's reader) took and dropped the poller's lock every turn,
// two locked instructions a raw QP's spin does not run.
type quietCQ interface{ Quiet() bool }

// pollFor is poll that hands back, in mine (if not nil), up to
// len(mine.fs) outcomes of self's requests instead of finishing them: a
// caller that pops self's completions next finishes them under the same
// lock of self's mutex. Likewise msgs (if not nil) takes messages to
// self's port.
func (pl *poller) pollFor(self *Queue, mine *ownRun, msgs *ownMsgs) int {
	if pl.quiet != nil && pl.quiet.Quiet() || !pl.mu.TryLock() {
		return 0
	}
	n := pl.pollLocked(self, mine, msgs)
	pl.mu.Unlock()
	return n
}

// pollAwake is poll for a waiter that slept on the completion queue and
// was woken by completions: it waits for a concurrent poller to finish
// instead of returning at once. That poller may not have taken what woke
// the waiter (it may be preempted, or past its look at the queue), and a
// waiter whose poll is refused sleeps again on a queue that still holds
// completions, so its Wait returns at once: a busy loop for as long as
// the other holds the lock (measured across processes on a loaded host:
// 1.7 million sleeps for 32 thousand messages).
func (pl *poller) pollAwake() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.pollLocked(nil, nil, nil)
}

// pollLocked is pollFor's work; pl.mu held.
func (pl *poller) pollLocked(self *Queue, mine *ownRun, msgs *ownMsgs) int {
	rt := pl.rt
	n, err := pl.cq.Poll(pl.wcs)
	if err != nil {
		pl.pollFailed(err)
		return 0
	}
	pl.dispatched += uint64(n)
	m := rt.byQPN.Load()
	fin := pl.fin[:0]
	wcs := pl.wcs[:n]
	for i := range wcs {
		wc := &wcs[i]
		if wc.ID&recvBit != 0 {
			rt.recv.onWC(wc, self, msgs)
			continue
		}
		if p := pl.pqpOf(m, wc.QPN); p != nil && (mine == nil || !p.completeOwn(wc, self, mine)) {
			fin = p.complete(wc, fin)
		}
	}
	if len(fin) > 0 {
		pl.finishAll(fin, self, mine)
	}
	return n
}

// pollFailed logs the CQ's failure err, once: apart from pollLocked, so
// that the logging's code is not among the lines every poll runs. A
// closed runtime's CQ is gone by design: a Pop after Close meets it, which
// is no failure to report.
//
//go:noinline
func (pl *poller) pollFailed(err error) {
	if !pl.rt.stopped() && !pl.failed.Swap(true) {
		pl.rt.log.Error("completion queue failed", "err", err)
	}
}

// finishAll finishes the outcomes fin that pollLocked's completions gave,
// queue by queue, handing self's to mine where they fit; apart from
// pollLocked, which a receive or a caller's own completion (completeOwn)
// leaves without any; pl.mu held.
func (pl *poller) finishAll(fin []finished, self *Queue, mine *ownRun) {
	for rest := fin; len(rest) > 0; {
		q, k := rest[0].q, 1
		for k < len(rest) && rest[k].q == q {
			k++
		}
		if q == self && mine != nil && mine.n+k <= len(mine.fs) {
			for i := range rest[:k] {
				// Element by element: copy of a type with
				// pointers is a runtime call (typedslicecopy).
				mine.fs[mine.n] = outcome{seq: rest[i].seq, n: rest[i].n, status: rest[i].status}
				mine.n++
			}
		} else {
			q.finishRun(rest[:k])
		}
		for i := range rest[:k] {
			rest[i].q = nil // the scratch keeps no queue alive
		}
		rest = rest[k:]
	}
	pl.fin = fin[:0] // keeps what complete grew
}

// dispatchedSoFar is how many completions the poller has dispatched.
func (pl *poller) dispatchedSoFar() uint64 {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.dispatched
}

// pqpOf is the QP numbered qpn in m (the runtime's byQPN), remembering the
// last one found: completions come in runs from one QP, and a map lookup
// is a good part of dispatching one. pl.mu held.
func (pl *poller) pqpOf(m *map[uint32]*pqp, qpn uint32) *pqp {
	if m != pl.lastMap || qpn != pl.lastQPN {
		pl.lookup(m, qpn)
	}
	return pl.lastPQP
}

// lookup is pqpOf's look at m for a QP other than the last: apart, so
// that the map access's call is not among the lines a run of one QP's
// completions runs; pl.mu held.
//
//go:noinline
func (pl *poller) lookup(m *map[uint32]*pqp, qpn uint32) {
	pl.lastMap, pl.lastQPN, pl.lastPQP = m, qpn, (*m)[qpn]
}

// failRecs finishes records that never reached a QP.
func (rt *Runtime) failRecs(rs []rec, st verbs.Status) {
	for _, r := range rs {
		r.q.finish(r.seq, st, 0)
	}
}

// wait blocks until ready reports true, ctx ends or the runtime closes. The
// caller polls the completion queue itself for a short while (see spins);
// then one waiter at a time sleeps on the completion queue (and dispatches
// what wakes it) while the others wait for their queue's wake-up (waker),
// taking the role over when it frees or from a waiter of another queue
// (displace). arm, if not nil, runs before every sleep (see Group.Wait).
//
// A wait on a queue that is closed (or closes meanwhile) fails with
// ErrClosed once ready reports false: what finished before is still
// popped first, and Close wakes the queue's waiters to see it.
func (pl *poller) wait(ctx context.Context, q *Queue, ready func() bool, arm func()) error {
	closed := false
	if q != nil {
		user := ready
		ready = func() bool {
			if user() {
				return true
			}
			closed = q.isClosed()
			return closed
		}
	}
	err := pl.waitReady(ctx, q, ready, arm)
	if err == nil && closed {
		err = fmt.Errorf("core: queue %d: %w", q.id, krcore.ErrClosed)
	}
	return err
}

// waitReady is wait without the closed queue's check.
func (pl *poller) waitReady(ctx context.Context, q *Queue, ready func() bool, arm func()) error {
	// Counted before the first look at ready: whoever changes what ready
	// reads and then kicks q sees the count, or this look sees the change.
	q.waiters.Add(1)
	defer q.waiters.Add(-1)
	token := false       // this goroutine took the role hand-over token
	var displaced *Queue // the waiter this one took the role from
	defer func() {
		if token {
			pl.passRole()
		}
		if displaced != nil && (displaced != pl.own || pl.rt.sends.asleep.Load() > 0) { // see ownAside
			pl.rt.kick(displaced)
		}
	}()
	spin := pl.spins()
	var start time.Time
	for i := 0; ; i++ {
		if ready() {
			return nil
		}
		if pl.poll() > 0 && ready() {
			if spin && i > 0 {
				pl.scoreSpin(true)
			}
			return nil
		}
		if spin {
			if i == 0 {
				start = time.Now()
			}
			if i%32 != 31 {
				continue
			}
			if time.Since(start) < spinFor {
				runtime.Gosched()
				continue
			}
			pl.scoreSpin(false)
			spin = false
		}
		if arm != nil {
			arm()
		}
		pl.rt.rest.sleeping()
		pl.asleep.Add(1)
		if pl == pl.rt.sends && pl.rt.recvs.ownLazy.Load() { // after the Add: see ownAside
			pl.rt.rest.wake()
		}
		done, err := pl.sleep(ctx, q, ready, &token, &displaced)
		pl.asleep.Add(-1)
		pl.rt.rest.awake()
		if done || err != nil {
			return err
		}
	}
}

// Spinning pays when completions come within spinFor of the first empty
// poll (a hardware RNIC) and costs when they take longer: on a TCP wire a
// sleeping waiter reads the socket itself, while a spinning one only burns
// the core the peer needs. So each poller keeps a score of its recent spins
// (found the completion: up; had to sleep anyway: down), spins while it is
// not negative, and tries again every spinProbe waits when it is.
const (
	spinProbe    = 64
	spinScoreMax = 8
)

// spins reports whether the next wait should spin before it sleeps. On a
// device that progresses in CQ.Wait (DeviceAttr.ProgressInWait) it never
// does: the score would count a completion that the device's own reader
// handed over during the spin as a hit, yet it came later than to a
// waiter (over TCP in one process: 15.6-17.1 us per 8 B READ with the
// adaptive spin, 13.1-14.0 us without, a raw DC QP 12.7-13.3 us).
func (pl *poller) spins() bool {
	if pl.noSpin {
		return false
	}
	return pl.spinScore.Load() >= 0 || pl.spinWaits.Add(1)%spinProbe == 0
}

// scoreSpin records whether a spin found its completion.
func (pl *poller) scoreSpin(hit bool) {
	v := pl.spinScore.Load()
	switch {
	case hit && v < spinScoreMax:
		pl.spinScore.Store(v + 1)
	case !hit && v > -spinScoreMax:
		pl.spinScore.Store(v - 1)
	}
}

// sleep waits once for something to happen; it reports done when it found
// ready true. Each of its ways of sleeping looks at ready once more after
// making sure that a wake-up coming later reaches it, so none is lost.
func (pl *poller) sleep(ctx context.Context, q *Queue, ready func() bool, token *bool, displaced **Queue) (done bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if pl.rt.stopped() {
		return false, errRuntimeClosed
	}
	if pl.waitMu.TryLock() {
		*token = false
		if pl.lent.Load() {
			pl.lent.Store(false) // taken back (see lend)
		}
		gen := q.waker.gen.Load()
		done, err := pl.sleepOnCQ(ctx, q, ready)
		var woken <-chan struct{}
		if errors.Is(err, errRoleTaken) {
			// Watch before the role frees: the taker kicks q when it
			// leaves, which may be as soon as it has the role.
			woken = q.waker.watch()
		}
		lend := err == nil && pl.lends()
		if lend {
			pl.lend()
		}
		pl.waitMu.Unlock()
		if !lend {
			pl.passRole()
		}
		switch {
		case woken == nil:
			return done, err
		case q.waker.gen.Load() != gen:
			return false, nil // kicked since it took the role: look again
		case q == pl.own:
			return pl.ownAside(ctx, woken, ready, nil)
		}
		return pl.sleepAside(ctx, woken, ready, nil)
	}
	if q == pl.own {
		return pl.ownAside(ctx, q.waker.watch(), ready, token)
	}
	if *displaced == nil && q != pl.own {
		*displaced = pl.displace(q)
	}
	return pl.sleepAside(ctx, q.waker.watch(), ready, token)
}

// sleepAside waits for its queue's wake-up (woken), or for the token that
// passes the role of sleeping on the completion queue (token not nil).
func (pl *poller) sleepAside(ctx context.Context, woken <-chan struct{}, ready func() bool, token *bool) (bool, error) {
	if ready() {
		return true, nil
	}
	var wake chan struct{} // nil: not taking the token
	if token != nil {
		wake = pl.wake
		pl.asideTok.Add(1)
		defer pl.asideTok.Add(-1)
	}
	select {
	case <-woken:
	case <-wake:
		*token = true
	case <-ctx.Done():
		return false, ctx.Err()
	case <-pl.rt.stop:
		return false, errRuntimeClosed
	}
	return false, nil
}

// ownAside keeps serveRecvs off the receive completion queue while an
// application waiter holds it or took it over, unless a goroutine sleeps
// on the send queue: it looks again after restRound, when its queue is
// kicked or such a sleeper comes (which may count on it to dispatch the
// receive queue: PopAnyWait, a Group), not when the waiter leaves the
// queue, and it does not take the hand-over token. A waiter that pops its
// port in a loop (a ping-pong's reader) leaves the queue after every
// message and is back within microseconds; when the runtime's own waiter
// took the queue back at each leave, the next wait displaced it again, a
// wake-up of it each way, and meanwhile it held the queue (on the soft
// RNIC: read the shared-memory link) and handed the message over, another
// wake-up (MEASUREMENTS.md, SMC-R session 18). Messages to ports nobody
// waits on wait at most restRound longer. With a sleeper on the send
// queue it waits aside as any displaced waiter does (token as
// sleepAside's).
func (pl *poller) ownAside(ctx context.Context, woken <-chan struct{}, ready func() bool, token *bool) (bool, error) {
	pl.ownLazy.Store(true)
	if pl.rt.sends.asleep.Load() != 0 { // after the Store: see waitReady
		pl.ownLazy.Store(false)
		return pl.sleepAside(ctx, woken, ready, token)
	}
	defer pl.ownLazy.Store(false)
	if ready() {
		return true, nil
	}
	if pl.ownTimer == nil {
		pl.ownTimer = time.NewTimer(restRound)
	} else {
		pl.ownTimer.Reset(restRound)
	}
	defer pl.ownTimer.Stop()
	select {
	case <-woken:
	case <-pl.rt.rest.nudge:
	case <-pl.ownTimer.C:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-pl.rt.stop:
		return false, errRuntimeClosed
	}
	return false, nil
}

// errRoleTaken ends a sleep on the completion queue that another waiter
// took over.
var errRoleTaken = errors.New("core: completion queue role taken over")

// displace asks the waiter sleeping on the completion queue for another
// queue to leave the role to q's waiter, and returns that queue: the
// newest waiter is the likelier to expect a completion soon (the holder is
// often a service waiting for rare messages), and on a provider whose
// waiter reads the wire itself (the soft RNIC over TCP) only the role
// holder's completions arrive without a goroutine hand-off. The displaced
// waiter sleeps on its queue's channel until q's waiter kicks it on
// leaving (see wait) or its own completions come.
func (pl *poller) displace(q *Queue) *Queue {
	r := pl.role.Load()
	if r == nil || r.q == q || !r.taken.CompareAndSwap(false, true) {
		return nil
	}
	r.cancel()
	return r.q
}

// lendFor bounds a lend of the completion-queue role (see lend): how much
// later than a hand-over a waiter asleep aside takes the role when the
// waiter that lent it is not back.
const lendFor = 100 * time.Microsecond

// lend is a sleeper on the completion queue whose sleep ended well (it
// leaves with what it waited for, or looks again and sleeps again) while
// waiters sleep aside for the hand-over token: instead of passing the role
// on (passRole) it lends it, so that its next sleep, a ping-pong's within
// microseconds, takes it back without waking anyone. Passed on, the role
// went to a waiter aside (lite's serving goroutine), which the next wait
// then found holding the queue, slept aside and was woken by: in lite's
// in-process RPC 0.29-0.66 wake-ups of the waiter aside a call
// (MEASUREMENTS.md, "Runtime cost", session 22). Whoever takes the role
// next ends the lend (sleep). If nobody does within lendFor, endLend
// passes the role on: a waiter aside still gets it, and the messages it
// waits for get dispatched, when the lender does not come back, at most
// lendFor later than a hand-over (as for a sleeper on the send queue that
// counts on the receive queue's dispatch: PopAnyWait, a Group). Only
// where the queue's completions come without a waiter (lends). waitMu
// held.
func (pl *poller) lend() {
	pl.lent.Store(true)
	pl.lendTimer.Reset(lendFor)
}

// lends reports whether a sleeper leaving the completion queue lends the
// role (lend): when waiters sleep aside for it, and the queue's completions
// come without a waiter (a hardware RNIC's by DMA, the soft RNIC's over its
// in-memory wire). On a soft RNIC's TCP or shared-memory link the role's
// holder reads the link in CQ.Wait; lent there, smc's 8 B round trip over
// the TCP link across processes was 1.40-1.76x TCP's (median 1.52x, 8
// `krbench smc` runs) against 1.31-1.72x (1.39x, 7) handed on.
func (pl *poller) lends() bool {
	if pl.asideTok.Load() == 0 || pl.rt.stopped() {
		return false
	}
	return !pl.noSpin || pl.progressesAlone()
}

// progressesAlone reports whether the completion queue's completions
// come without a waiter now (see the progressesAlone interface).
func (pl *poller) progressesAlone() bool { return pl.alone != nil && pl.alone.ProgressesAlone() }

// endLend ends a lend nobody took back within lendFor: the role passes on.
// It runs on its own goroutine (the lend timer's).
func (pl *poller) endLend() {
	if pl.lent.CompareAndSwap(true, false) {
		pl.passRole()
	}
}

// passRole lets one sleeping waiter take the completion-queue role.
func (pl *poller) passRole() {
	select {
	case pl.wake <- struct{}{}:
	default:
	}
}

// roleHolder is the waiter sleeping on the completion queue; a dispatcher
// that finishes its request cancels its sleep, because another poller may
// have taken the completion that would have woken it.
//
// A holder is never changed once published but for taken, so the next
// sleep of the same queue with the same sleep context publishes it again
// (see sleepOnCQ) instead of allocating one per sleep: the runtime's own
// waiter sleeps once per message that reaches a node nobody else waits
// on. A displacer that found it in an earlier sleep and takes it now takes
// the current sleep, which is the same waiter's.
type roleHolder struct {
	q      *Queue
	ctx    context.Context // the sleep context cancel ends
	cancel context.CancelFunc
	taken  atomic.Bool // another waiter takes the role over (displace)
}

// sleepOnCQ sleeps on the completion queue until it has completions, ctx
// ends or a dispatcher wakes q (kick cancels the sleep of the role holder
// it finds, so a holder needs no waker channel: it publishes its role
// before its last look at ready). The sleep's context lives across sleeps
// (sctx, guarded by waitMu): a provider may attach work to the context it
// waits with (the soft RNIC watches it to interrupt a blocked read), and a
// fresh context per sleep would redo that work and, once cancelled, fire it
// each time. Only a dispatcher's wake-up or the end of ctx cancels it.
func (pl *poller) sleepOnCQ(ctx context.Context, q *Queue, ready func() bool) (bool, error) {
	if pl.sctx == nil || pl.sctx.Err() != nil {
		sctx, cancel := context.WithCancel(context.Background())
		pl.cancelMu.Lock()
		pl.sctx, pl.scancel = sctx, cancel
		pl.cancelMu.Unlock()
	}
	pl.watch(ctx)
	if err := ctx.Err(); err != nil {
		// ctx ended before the new sleep context was in place: its
		// watch cancelled the one before.
		return false, err
	}
	if k := pl.rt.readied.Load(); k != pl.readiedSeen {
		// A dispatch (this goroutine's, most likely) woke a waiter
		// asleep on another queue, readied on this P: the provider's
		// Wait may spin or sleep in a system call holding the P, and
		// across processes the woken goroutine then ran only when that
		// spin ended (~20 us later; the RPC callee's serving goroutine
		// in two of three calls). Let it run first.
		pl.readiedSeen = k
		runtime.Gosched()
	}
	r := pl.lastRole
	if r == nil || r.q != q || r.ctx != pl.sctx || r.taken.Load() {
		r = &roleHolder{q: q, ctx: pl.sctx, cancel: pl.scancel}
		pl.lastRole = r
	}
	pl.role.Swap(r) // a store no later load passes, even under the race detector (golang/go#58020)
	defer pl.role.Store(nil)
	if ready() { // finished before the role was published
		return true, nil
	}
	if pl.rt.stopped() { // Close looked for a role holder before r was published
		return false, errRuntimeClosed
	}
	pl.sleeps.Add(1)
	err := pl.cq.Wait(pl.sctx)
	// Awake: nothing need cancel this sleep now. Left published, the
	// role made pollAwake's own dispatch of q's completion cancel the
	// sleep context (kick), and the next sleep made a new one and
	// registered it with ctx and the provider again: ~9 allocations and
	// two AfterFunc registrations per request that slept.
	pl.role.Store(nil)
	switch {
	case pl.rt.stopped():
		return false, errRuntimeClosed // Close cancelled the sleep, or closed the CQ
	case r.taken.Load():
		return false, errRoleTaken
	case err == nil:
		pl.pollAwake() // woken by a completion
		return false, nil
	case pl.sctx.Err() != nil && ctx.Err() == nil:
		return false, nil // woken by a dispatcher
	case ctx.Err() != nil:
		return false, ctx.Err()
	}
	return false, fmt.Errorf("core: wait for completions: %w", err)
}

// watch makes the end of ctx cancel the sleep context. The registration
// stays for the next sleep with the same context (a caller that bounds
// every wait with one deadline would otherwise pay for registering and
// removing it on every sleep); if that context ends later, while another
// waiter sleeps, the sleeper wakes once for nothing and sleeps again.
// waitMu held.
func (pl *poller) watch(ctx context.Context) {
	done := ctx.Done()
	if done == nil || done == pl.wdone {
		return
	}
	pl.stopWatch()
	pl.wdone, pl.wstop = done, context.AfterFunc(ctx, pl.onDone)
}

// cancelSleep cancels the current sleep context, whichever it is when a
// watched context ends: the registration outlives the sleep contexts that
// dispatchers' wake-ups cancel, so a new one costs no new registration.
func (pl *poller) cancelSleep() {
	pl.cancelMu.Lock()
	cancel := pl.scancel
	pl.cancelMu.Unlock()
	cancel()
}

// stopWatch drops the registration of watch; waitMu held.
func (pl *poller) stopWatch() {
	if pl.wstop != nil {
		pl.wstop()
		pl.wdone, pl.wstop = nil, nil
	}
}

// errRuntimeClosed fails the waits that the runtime's Close ends.
var errRuntimeClosed = fmt.Errorf("core: runtime: %w", krcore.ErrClosed)

// wakeAll wakes whoever sleeps on the completion queue, so that it sees
// the runtime stopped (see sleepOnCQ); the others sleep on rt.stop too.
func (pl *poller) wakeAll() {
	if r := pl.role.Load(); r != nil {
		r.cancel()
	}
	pl.lendTimer.Stop()
}

// kick wakes q's waiters, wherever they sleep, and its group's. A queue
// nobody waits on (its user spins on Pop, or is busy elsewhere) costs a
// load: its next wait looks at its state before it sleeps.
func (rt *Runtime) kick(q *Queue) {
	// The check here, the wake-ups apart (wakeUp), so that a queue nobody
	// waits on pays two loads; kick itself is not inlined (cost 84 > 80).
	if q.waiters.Load() > 0 || q.group.Load() != nil {
		rt.wakeUp(q)
	}
}

// wakeUp is kick's work, for a queue someone waits on or in a group.
func (rt *Runtime) wakeUp(q *Queue) {
	if q.waiters.Load() > 0 {
		woke := q.waker.wake()
		for _, pl := range [...]*poller{rt.sends, rt.recvs} {
			if r := pl.role.Load(); r != nil && r.q == q {
				r.cancel()
				woke = true
			}
		}
		if woke {
			rt.readied.Add(1)
		}
	}
	if g := q.group.Load(); g != nil {
		rt.kick(g)
	}
}

// waker wakes every goroutine waiting on one queue. A queue may have
// several (one for completions, one for messages, one for credits, as
// krcored's per-VQ goroutines do), and wake-ups for two of them can come
// back to back: a single token would wake one and leave the other asleep
// with its completion ready. So a waiter watches a channel that the next
// wake closes.
type waker struct {
	mu    sync.Mutex
	ch    chan struct{} // nil until someone watches
	armed atomic.Bool   // ch != nil, read by wake without the lock
	// gen counts wake-ups, so a waiter that slept without watching (the
	// completion queue's role holder) can tell whether one came since.
	gen atomic.Uint64
}

// watch returns the channel the next wake closes. Call it before the last
// look at the state a wake reports changed.
func (w *waker) watch() <-chan struct{} {
	w.mu.Lock()
	if w.ch == nil {
		w.ch = make(chan struct{})
		w.armed.Store(true)
	}
	ch := w.ch
	w.mu.Unlock()
	return ch
}

// wake wakes the goroutines watching; call it after changing the state.
// It reports whether any watched.
func (w *waker) wake() bool {
	w.gen.Add(1)
	if !w.armed.Load() {
		return false
	}
	w.mu.Lock()
	woke := w.ch != nil
	if woke {
		close(w.ch)
		w.ch = nil
		w.armed.Store(false)
	}
	w.mu.Unlock()
	return woke
}
