package daemon

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// batch is how many SQEs a client's pump takes, over all its VQs, before
// it lets the other clients' pumps run.
const batch = 32

// pump is the one goroutine that drives all of a client's VQs: it consumes
// their submission rings, pushes to the runtime and fills their completion
// rings. One goroutine per client, not per VQ, is what makes the daemon
// fair between clients: a client flooding from many VQs has one runnable
// goroutine in the daemon, as a client with one VQ has, and it yields after
// every batch.
type pump struct {
	ss    *session
	g     *core.Group
	spin  time.Duration
	limit int // the client's requests in flight, over all its VQs
	done  chan struct{}

	asleep atomic.Bool  // armed to sleep, see nudge
	woke   atomic.Int64 // when it last woke to work after brief work, Server.clock
	nap    *time.Timer  // see share

	// mu guards vqs and the scratch below. Whoever touches a VQ's ring
	// holds it, so a VQ that remove took out can be unmapped.
	mu   sync.Mutex
	vqs  []*vq
	next int // the VQ a round starts with, round robin
	reqs []krcore.Request
	out  []krcore.Completion
	// now is Server.clock at the last round, 0 until read (roundClock);
	// the pump goroutine's alone, as round runs only there (run,
	// spinRounds, and Wait's ready func).
	now int64
	// rounds counts rounds; worked is the last that did work (see
	// clientAsleep). Guarded by mu.
	rounds, worked uint64
}

func newPump(ss *session) *pump {
	p := &pump{ss: ss, g: ss.s.rt.Group(), spin: ss.s.cfg.Spin, limit: ss.s.cfg.ClientCredits,
		done: make(chan struct{}), reqs: make([]krcore.Request, 0, batch), out: make([]krcore.Completion, 64)}
	return p
}

// add starts serving v.
func (p *pump) add(v *vq) {
	p.join(v)
	p.g.Add(v.q)
	p.g.Wake()
}

// join puts v among the VQs the pump serves. A pump armed to sleep arms v
// too: the Wake that follows may reach it before it sleeps, and its sleep
// would then wait for a doorbell that v's client, unarmed, never rings.
func (p *pump) join(v *vq) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.vqs = append(p.vqs, v)
	if p.asleep.Load() {
		wire.Publish(v.ring.Ctr(wire.DaemonSleeps), 1)
		v.armedTail.Store(v.ring.Ctr(wire.SQTail).Load())
	}
}

// remove stops serving v; when it returns, no round touches v.
func (p *pump) remove(v *vq) {
	p.mu.Lock()
	p.vqs = slices.DeleteFunc(p.vqs, func(x *vq) bool { return x == v })
	p.mu.Unlock()
	p.g.Remove(v.q)
}

// run serves the client's VQs until its session ends.
func (p *pump) run() {
	defer close(p.done)
	ctx := p.ss.ctx
	var busy int64 // Server.clock when the current stretch of work began; 0: none
	for ctx.Err() == nil {
		if p.round() || p.spinRounds() {
			p.ss.s.nudge(p)
			now := p.roundClock() // the round's, if it read the clock
			if busy == 0 {
				busy = now
			}
			if !p.share(now, &busy) {
				runtime.Gosched() // one batch per turn: the other clients' turn
			}
			continue
		}
		brief := busy == 0 || p.ss.s.clock()-busy < int64(p.ss.s.cfg.ShareQuantum)
		busy = 0
		err := p.g.Wait(ctx, p.round, p.arm)
		p.disarm()
		if err != nil {
			return
		}
		if brief {
			p.woke.Store(p.ss.s.clock())
		}
	}
}

// interactiveFor is how recently a pump must have woken to work, after a
// stretch of work shorter than the share quantum, for its client to count
// as interactive (one that sleeps between its requests), see share.
const interactiveFor = time.Millisecond

// napRatio is how much longer than it worked a paced pump sleeps: it works
// one quantum in four.
const napRatio = 3

// share makes a pump that has worked without a break (since busy, by
// Server.clock; now is the clock at its last round) for the share quantum
// (Config.ShareQuantum) sleep three times as long (napRatio) while another
// client is interactive, and reports whether it slept. Gosched
// shares the daemon's Go scheduler between pumps, but not the node's
// cores: a flood keeps its pump and its own process busy, ~1.4 of 2 cores,
// and every wake-up of an interactive client (its pump on a doorbell, the
// client on its completion) then waits for the kernel to preempt one of
// them, up to a scheduler slice (1.4 ms here) at p99. Pacing the flood to
// a quarter of a core leaves a core free to run them at once; the flood's
// own process, its submission ring full, sleeps meanwhile. The flood pays:
// its rate beside an interactive client falls 3-5x (TestFloodFairness logs
// it). A client alone, or among clients that keep their pumps busy (as
// connects/s from 4 processes does), is not paced.
func (p *pump) share(now int64, busy *int64) bool {
	s := p.ss.s
	if s.cfg.ShareQuantum <= 0 {
		return false
	}
	ran := time.Duration(now - *busy)
	if ran < s.cfg.ShareQuantum || !s.othersInteractive(p) {
		return false
	}
	// ran is a quantum and part of a batch, unless the kernel kept the
	// pump off its core for a while: it ran long without working long.
	nap := napRatio * min(ran, 2*s.cfg.ShareQuantum)
	if p.nap == nil {
		p.nap = time.NewTimer(nap)
	} else {
		p.nap.Reset(nap)
	}
	select {
	case <-p.nap.C:
	case <-p.ss.ctx.Done():
	}
	p.ss.naps.Add(1)
	*busy = 0
	return true
}

// othersInteractive reports whether the pump of a client other than
// self's woke to work lately after brief work.
func (s *Server) othersInteractive(self *pump) bool {
	ps := s.pumps.Load()
	if ps == nil {
		return false
	}
	now := s.clock()
	for _, p := range *ps {
		if p != self && now-p.woke.Load() < int64(interactiveFor) {
			return true
		}
	}
	return false
}

// inflightLocked is how many of the client's requests the runtime holds;
// p.mu held.
func (p *pump) inflightLocked() int {
	n := 0
	for _, v := range p.vqs {
		n += int(v.accepted.Load() - v.retired)
	}
	return n
}

// waitsOnFabric reports whether the client has requests in flight and the
// device gets completions to a sleeping waiter sooner than to a poller
// (core.Group.SpinPays): then the pump sleeps in Wait, which reads the
// completion itself, rather than spin and hold a core that the fabric's
// peer may need (on the soft RNIC, the other node's process). A client
// with nothing in flight is about to push: that is what the spin is for.
func (p *pump) waitsOnFabric() bool {
	if p.g.SpinPays() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflightLocked() > 0
}

// spinRounds polls for up to p.spin before the pump sleeps, and reports
// whether it found work. It polls without yielding (runtime.Gosched):
// a goroutine that yields in a loop keeps every P of the process busy
// (each yield wakes an idle P to look for work), so none idles into the
// network poller and Go polls file descriptors only from sysmon, every
// few milliseconds. Every fd wake-up in krcored (the client's bell, the
// soft link's sockets) then waited for the spin to end
// (TestSpinLetsNetpollRun). A spin that holds its P leaves the others to
// idle in the poller; other goroutines run there, and on this P when the
// spin ends, within p.spin.
//
// It stops as soon as the client sleeps on one of its VQs' bells (see
// clientAsleep).
func (p *pump) spinRounds() bool {
	if p.spin <= 0 || p.waitsOnFabric() {
		return false
	}
	for start := time.Now(); time.Since(start) < p.spin; {
		p.g.Poll()
		if p.round() {
			return true
		}
		if p.clientAsleep() {
			return false
		}
	}
	return false
}

// clientAsleep reports whether the client sleeps waiting for a completion
// or a message on a VQ of the pump's last work. Such a client is not
// about to push: it waits for what the fabric brings (an echo, a reply),
// and when it wakes its push rings the doorbell. A spin through that wait
// would hold a core for the whole round trip, one that the round trip's
// other processes (or, in one process, the goroutines of both ends) need
// on a machine of two; a client that stays awake (polls its rings) keeps
// the pump spinning. Other VQs' sleepers (a server's queue waiting for
// rare messages) say nothing about the next push. The flags are written
// only when the client goes to sleep and wakes, so reading them per poll
// costs no line the client writes.
func (p *pump) clientAsleep() bool {
	if !p.mu.TryLock() {
		return false
	}
	defer p.mu.Unlock()
	for _, v := range p.vqs {
		r := v.ring
		if v.workedIn == p.worked && (r.Ctr(wire.ClientMsg).Load() != 0 || r.Ctr(wire.ClientCQ).Load() != 0) {
			return true
		}
	}
	return false
}

// arm tells the client to ring the doorbell, and busy pumps to nudge this
// one: it is going to sleep. asleep is raised under p.mu, so that join
// arms a VQ that comes later.
func (p *pump) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.vqs {
		wire.Publish(v.ring.Ctr(wire.DaemonSleeps), 1)
		v.armedTail.Store(v.ring.Ctr(wire.SQTail).Load())
	}
	p.asleep.Store(true)
}

func (p *pump) disarm() {
	p.asleep.Store(false)
	p.mu.Lock()
	for _, v := range p.vqs {
		v.ring.Ctr(wire.DaemonSleeps).Store(0)
	}
	p.mu.Unlock()
}

// pushedSinceArm reports whether the client pushed to a VQ since the pump
// armed to sleep. A pump that is changing its VQs is left to its doorbell.
func (p *pump) pushedSinceArm() bool {
	if !p.mu.TryLock() {
		return false
	}
	defer p.mu.Unlock()
	for _, v := range p.vqs {
		if v.ring.Ctr(wire.SQTail).Load() != v.armedTail.Load() {
			return true
		}
	}
	return false
}

// publishPumps copies the sessions' pumps for nudge; s.mu held.
func (s *Server) publishPumps() {
	ps := make([]*pump, 0, len(s.sessions))
	for _, ss := range s.sessions {
		ps = append(ps, ss.pump)
	}
	s.pumps.Store(&ps)
}

// nudge wakes the sleeping pumps whose clients pushed since they slept.
// A busy pump calls it between batches: it is already on a core, while the
// client's doorbell reaches a sleeping pump through the poller and a
// thread the kernel must first schedule, which on a loaded machine takes
// up to a scheduler slice (milliseconds). The doorbell still rings; nudge
// only gets there first.
func (s *Server) nudge(self *pump) {
	ps := s.pumps.Load()
	if ps == nil {
		return
	}
	for _, p := range *ps {
		if p != self && p.asleep.Load() && p.pushedSinceArm() && p.asleep.CompareAndSwap(true, false) {
			p.g.Wake()
		}
	}
}

// round does what the client's VQs have for it, a batch at most, and
// reports whether it did anything. It never blocks.
func (p *pump) round() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	vqs := p.vqs
	n := len(vqs)
	if n == 0 {
		return false
	}
	inflight := p.inflightLocked()
	p.now = 0
	p.rounds++
	did, budget := false, batch
	for i := range n {
		v := vqs[(p.next+i)%n]
		if v.ctx.Err() != nil {
			continue
		}
		worked := p.complete(v)
		if budget > 0 && inflight < p.limit {
			k, moved := p.submit(v, min(budget, p.limit-inflight))
			budget -= k
			inflight += k
			worked = worked || moved
		}
		if worked {
			v.workedIn, did = p.rounds, true
		}
	}
	if did {
		p.worked = p.rounds
	}
	p.next++
	return did
}

// roundClock is the time of the round's stamps (vq.sent, vq.observe): the
// clock is read once per round that has requests or completions, not per
// request nor per VQ, because a read costs as much as the observations of
// a batch (BenchmarkObserve). A request's time is thus from the round that
// took it off the ring to the round that posted its completion, off by
// less than a round's work (a batch). run takes the same reading for
// share, which would otherwise read the clock after every round itself.
func (p *pump) roundClock() int64 {
	if p.now == 0 {
		p.now = p.ss.s.clock()
	}
	return p.now
}

// submit consumes up to limit of v's SQEs; k is how many requests the
// runtime accepted, moved whether any entry was consumed.
func (p *pump) submit(v *vq, limit int) (k int, moved bool) {
	r := v.ring
	avail := r.Ctr(wire.SQTail).Load() - v.seq
	if avail == 0 || v.connecting.Load() {
		return 0, false
	}
	if avail > wire.SQEntries {
		v.fail(fmt.Sprintf("submission tail %d entries ahead", avail))
		return 0, false
	}
	if !v.q.CanPush() {
		return 0, false
	}
	start, end := v.seq, v.seq+min(avail, uint64(limit))
	reqs := p.reqs[:0]
	seq := start
	now := p.roundClock()
	for ; seq < end; seq++ {
		e := r.GetSQE(seq)
		if e.Op == wire.OpConnectSQE {
			break
		}
		if e.Op == wire.OpRecv {
			if seq >= v.recvsTo { // not posted by an earlier, partial round
				v.postRecv(&e)
			}
			continue
		}
		reqs = append(reqs, v.request(seq, &e))
		v.sent(seq, now, reqClass(verbs.Opcode(e.Op), toInt(e.Len)))
	}
	k, next := p.push(v, reqs, seq)
	if k == len(reqs) && next < end {
		v.startConnect(p, next) // requests before it went where the VQ pointed
		next++
	}
	v.recvsTo = max(v.recvsTo, seq)
	v.seq = next
	wire.Publish(r.Ctr(wire.SQHead), next) // the entries are copied: the client may reuse them
	if avail == wire.SQEntries && next != start {
		// Only a client that found the ring full waits for its space;
		// waking one that waits for a completion would cost it a spurious
		// wake-up per push.
		wire.Notify(r.Ctr(wire.ClientCQ), v.cq)
	}
	return k, next != start
}

// push hands reqs to v's queue without waiting and returns how many it
// accepted and the SQE to resume at: past them all (end), or the first
// request refused for want of credit.
func (p *pump) push(v *vq, reqs []krcore.Request, end uint64) (int, uint64) {
	if len(reqs) == 0 {
		return 0, end
	}
	k, err := v.q.Push(v.ctx, false, reqs...)
	v.accepted.Add(uint64(k))
	v.ss.pushes.Add(uint64(k))
	if k < len(reqs) {
		end = reqs[k].ID
	}
	clear(reqs)
	if err != nil && !errors.Is(err, krcore.ErrNoCredit) {
		v.stop(err)
	}
	return k, end
}

// complete moves v's finished completions to its completion ring and
// reports whether there were any.
func (p *pump) complete(v *vq) bool {
	r := v.ring
	head := r.Ctr(wire.CQHead)
	used := v.pos - head.Load()
	if used > wire.CQEntries {
		v.fail(fmt.Sprintf("completion head %d entries off", used))
		return false
	}
	if used == wire.CQEntries {
		wire.Publish(r.Ctr(wire.DaemonFullCQ), 1) // the client rings when it frees space
		if v.pos-head.Load() == wire.CQEntries {
			return false
		}
	}
	if full := r.Ctr(wire.DaemonFullCQ); full.Load() != 0 {
		full.Store(0) // written only on change: the client reads this line
	}
	free := wire.CQEntries - (v.pos - head.Load())
	n := p.g.Pop(v.q, p.out[:min(int(free), len(p.out))])
	if n == 0 {
		return false
	}
	now := p.roundClock()
	for i := range p.out[:n] {
		c := &p.out[i]
		r.PutCQE(v.pos, wire.CQE{Seq: c.ID, Status: c.Status, Len: uint32(c.Len)})
		v.pos++
		v.observe(c.ID, now)
	}
	wire.Publish(r.Ctr(wire.CQTail), v.pos)
	v.publishRetired()
	v.ss.completions.Add(uint64(n))
	wire.Notify(r.Ctr(wire.ClientCQ), v.cq)
	v.notifyAny()
	return true
}

// drain waits, for at most the call timeout, until the runtime holds none
// of vqs' requests: it pops their completions and drops them (their client
// is gone). The pump must have stopped (its session ended), so no request
// is pushed meanwhile.
func (p *pump) drain(vqs map[uint64]*vq) error {
	ctx, cancel := context.WithTimeout(p.ss.s.ctx, p.ss.s.cfg.CallTimeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	left := 0
	done := func() bool {
		left = 0
		for _, v := range vqs {
			for p.g.Pop(v.q, p.out) > 0 {
			}
			left += v.q.Outstanding()
		}
		return left == 0
	}
	if err := p.g.Wait(ctx, done, nil); err != nil {
		return fmt.Errorf("daemon: %d requests did not finish: %w", left, err)
	}
	return nil
}

// startConnect runs the Connect SQE at seq in its own goroutine: a cold
// connect waits for other nodes, and the pump serves the client's other
// VQs meanwhile. v's later SQEs wait for it.
func (v *vq) startConnect(p *pump, seq uint64) {
	e := v.ring.GetSQE(seq)
	v.connecting.Store(true)
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		v.ringConnect(seq, &e)
		v.connecting.Store(false)
		p.g.Wake()
	}()
}

// watchDoor turns the client's doorbell into a wake-up of the pump, and of
// the messenger when it waits for ring space.
func (v *vq) watchDoor(p *pump) {
	defer v.wg.Done()
	for {
		if err := v.door.Sleep(v.ctx); err != nil {
			return
		}
		if v.ring.Ctr(wire.DaemonFullMsg).CompareAndSwap(1, 0) {
			select {
			case v.msgSpace <- struct{}{}:
			default:
			}
		}
		p.g.Wake()
	}
}

// stop ends a VQ whose queue failed (closed under it, say): its client
// learns it from its next call.
func (v *vq) stop(err error) {
	v.ss.s.log.Warn("VQ stopped", "client", v.ss.id, "vq", v.id, "err", err)
	v.cancel()
}
