//go:build linux

package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"time"
)

// Who reads a shared-memory link.
//
// As on a TCP link (read.go), reading the in ring is a role that moves, so
// that a response reaches the goroutine waiting for it without a hand-off:
// when the link's reader goroutine (the background reader) reads a
// response and pushes its completion, the waiter parked in CQ.Wait must be
// woken, a goroutine hand-off and often a thread woken for an idle P, each
// a scheduler decision that costs tens of microseconds on a loaded machine
// of two cores, against a round trip on the ring of one or two.
//
// So a goroutine that waits on a CQ whose requests went out on the link
// takes the role, if lent, and reads the ring itself, like a C program
// blocking in recv: it handles every frame that is in the ring whole
// (responses and the peer's requests alike), spinning for shmSpin after
// the last one, then sleeping on the link's futex word as the background
// reader would, so that the peer's next frame wakes this very thread. A
// completion from elsewhere, the context's end, a closing CQ or node, or
// the link's death wake it too. When it has its completion it leaves the
// role lent: the application is usually back within microseconds, and
// waking the background reader to read in between would cost what the
// role saves. After shmIdle with nothing for it, or when another waiter
// parks asking for the role, it hands the role back (to the asker, or to
// the background reader) and parks. A lent link has no reader, so:
//
//   - the background reader, asleep on a private futex word while it does
//     not hold the role, takes the role back once the link has stayed lent
//     for shmLend/2 (a request from the peer may wait that long while the
//     local application neither waits nor polls), for yieldGrace while a
//     waiter that yielded the role to another waits, and at once when the
//     link dies or output is queued for room in the peer's ring;
//   - a goroutine polling a CQ without waiting reads the CQ's lent link
//     itself, without waiting for data;
//   - a waiter that finds the role held asks for it and parks; the
//     background reader lends it to those that asked once no whole frame
//     header is left in the ring, and rings them.
//
// A waiter handles only frames wholly in the ring, so it never waits for
// the peer in the middle of one; a frame larger than the ring streams
// through it and is left to the background reader.

// Read roles of a shared-memory link.
const (
	shmRoleBackground = iota // the link's reader goroutine reads
	shmRoleLent              // nobody reads; a waiter or poller may take it
	shmRoleWaiter            // a goroutine waiting on (or polling) a CQ reads
	shmRoleDead              // the reader has unmapped the segment
)

// shmLend bounds how long a lent link stays unread: its background reader
// wakes every shmLend/2 while it does not hold the role, and takes it back
// if it has been lent that long.
const shmLend = time.Millisecond

// errLent ends a background reader's wait: it lent the role.
var errLent = errors.New("soft: shm read role lent")

// awaitRole waits until the background reader holds the read role: at
// once if it does, when a waiter hands it back, or when the link has
// stayed lent for shmLend/2, has output queued or died. It reports false
// once the link is dead and nobody reads it.
func (l *shmLink) awaitRole() bool {
	for {
		seq := l.roleSeq.Load()
		sleep := l.grace()
		switch l.role.Load() {
		case shmRoleBackground:
			return true
		case shmRoleDead:
			return false
		case shmRoleLent:
			// A waiter that kept the role to answer may not: its
			// ACKs wait at most until here.
			l.flushWake()
			idle := time.Duration(l.node.now() - l.lentAt.Load())
			grace := l.grace()
			if (idle >= grace || l.dead.Load() || l.pending.Load()) && l.role.CompareAndSwap(shmRoleLent, shmRoleBackground) {
				return true
			}
			if idle < grace {
				// Wake when the grace of the last lend ends: a
				// waiter's keep does not ring this reader.
				sleep = grace - idle
			}
		}
		// The frames this reader just handled may have readied waiters
		// on this P, and the wait below is a system call that keeps
		// the P until the runtime's monitor takes it back, which it
		// may do only after the whole wait (measured: a CQ waiter rung
		// with its completion ran 0.53-0.6 ms later, when the lent
		// role ran out). Let them run first, as futexSleep does.
		runtime.Gosched()
		futexWait(&l.roleSeq, seq, sleep)
	}
}

// grace is how long the link may stay lent, unread, before the background
// reader takes it back: shmLend/2, or yieldGrace while a waiter that gave
// the role up to another waits (it waits for what comes on the link too,
// and the other, once it has its completion, reads no more).
func (l *shmLink) grace() time.Duration {
	if l.yielders.Load() > 0 {
		return yieldGrace
	}
	return shmLend / 2
}

// kickReader wakes the background reader if it sleeps without the role.
func (l *shmLink) kickReader() {
	l.roleSeq.Add(1)
	futexWake(&l.roleSeq)
}

// lend lends the role (the background reader holds it) to the waiters that
// asked for it, and rings them.
func (l *shmLink) lend() {
	l.asked.Store(false)
	l.lentAt.Store(l.node.now())
	l.role.Swap(shmRoleLent)
	l.ringWanters()
}

// ringWanters rings the CQs of the waiters parked asking for the role.
func (l *shmLink) ringWanters() {
	if l.nwant.Load() == 0 {
		return
	}
	l.rmu.Lock()
	for _, c := range l.wanters {
		c.ringBell()
	}
	l.rmu.Unlock()
}

// take takes the role if it is lent.
func (l *shmLink) take() bool {
	return l.role.Load() == shmRoleLent && l.role.CompareAndSwap(shmRoleLent, shmRoleWaiter)
}

// claim is a waiter on c asking for the role: it takes it if lent, or
// else asks to be rung when it is lent.
func (l *shmLink) claim(c *cq) int {
	if l.take() {
		return claimTaken
	}
	if l.role.Load() == shmRoleDead || l.dead.Load() {
		return claimNone
	}
	l.rmu.Lock()
	l.wanters = append(l.wanters, c)
	l.nwant.Add(1)
	l.rmu.Unlock()
	l.asked.Store(true)
	// The holder may have lent the role before it saw the request.
	if l.take() {
		l.unwant(c)
		return claimTaken
	}
	return claimAsked
}

// unwant withdraws c's request for the role.
func (l *shmLink) unwant(c *cq) {
	l.rmu.Lock()
	dropWanter(&l.wanters, &l.nwant, c)
	l.rmu.Unlock()
}

// keep ends the turn of a waiter or poller that found what it looked for:
// the role stays lent, and the waiters that asked for it are rung. The
// background reader is woken only if it must read: the link died or
// output waits for room. Else it wakes when its grace, timed from this
// lend, ends (awaitRole): waking it to time its sleep anew cost a futex
// wake and a thread's wake-up per request while the runtime's receive
// waiter, which gave the role up, waits for messages (a yielder for as
// long as the process runs).
func (l *shmLink) keep() {
	l.asked.Store(false)
	l.lentAt.Store(l.node.now())
	l.role.Swap(shmRoleLent)
	l.ringWanters()
	if l.dead.Load() || l.pending.Load() {
		l.kickReader() // it reads now
	}
}

// addYielder counts a waiter that gave the role up to one that asked and
// still waits; the first one wakes the background reader, whose sleep may
// have been timed by the longer grace of a link without yielders.
func (l *shmLink) addYielder() {
	if l.yielders.Add(1) == 1 {
		l.kickReader()
	}
}

// handBack ends the turn of a waiter that did not get what it waits for:
// the role goes to those that asked for it, or else to the background
// reader, which is woken.
func (l *shmLink) handBack() {
	l.flushWake()
	if l.nwant.Load() > 0 && !l.dead.Load() {
		l.keep()
		return
	}
	l.role.Swap(shmRoleBackground)
	l.kickReader()
}

// pollFrames handles every frame that is wholly in the in ring, for a
// waiter or poller holding the role, and moves queued output. It returns
// how many bytes the in ring must hold for the next frame to be whole, or
// false if the link failed or the next frame is larger than the ring (the
// background reader streams it).
func (l *shmLink) pollFrames() (uint64, bool) {
	if l.dead.Load() {
		return 0, false
	}
	if l.pending.Load() {
		l.wmu.Lock()
		l.drainLocked()
		l.publishLocked()
		l.wmu.Unlock()
		l.pumpHeld()
	}
	s := l.seg
	for {
		a := l.avail()
		if a < uint64(len(l.rdHeader)) {
			return uint64(len(l.rdHeader)), true
		}
		if a > shmRingSize {
			l.kill()
			return 0, false
		}
		var b [4]byte
		s.copyOut(l.in, s.head(l.in).Load(), b[:])
		size := 4 + uint64(binary.BigEndian.Uint32(b[:]))
		if size > shmRingSize {
			return 0, false // streams through the ring, or malformed: the reader sees
		}
		if a < size {
			return size, true
		}
		if !l.handle() {
			l.kill()
			return 0, false
		}
	}
}

// handle reads and handles the frame whose header is in the ring; it
// reports false if the frame is malformed or the link failed in its middle.
func (l *shmLink) handle() bool {
	l.busy = time.Now()
	l.active.Store(l.node.now())
	l.consume(l.rdHeader[:])
	f := &l.f
	if decodeHeader(l.rdHeader[:], f) != nil || f.typ != frameRequest && f.typ != frameResponse {
		return false // a malformed frame ends the link
	}
	l.left = f.plen
	l.node.receive(l, f, l)
	return l.left == 0 || l.skipRest()
}

// skipRest reads what the frame's handler left of its payload.
func (l *shmLink) skipRest() bool {
	var skip [4096]byte
	for l.left > 0 {
		if _, err := l.Read(skip[:min(len(skip), int(l.left))]); err != nil {
			return false
		}
	}
	return true
}

// readShm reads l, whose role the caller took, for a waiter of c, until c
// has a completion (or an error to report) or ctx ends; then it keeps the
// role lent and reports got. It spins for shmSpin after the last frame it
// handled, then sleeps on the link's futex word, as the background reader
// does (the peer's next frame wakes this very thread); if c's last wait
// outlasted a spin it sleeps at once (see shmLink.slow), unless an
// exchange on l is under way and spinning pays (spinLearner). After shmIdle
// with nothing for c, it hands the role back; it reports yielded if it
// handed it to a waiter that asked for it.
func (c *cq) readShm(ctx context.Context, l *shmLink) (got, yielded bool) {
	begin := l.node.now()
	beginAt := time.Now() // wall clock too, for answeredIn
	slept := false
	spin := begin
	done := ctx.Done()
	budget := shmSpin
	expected := l.expecting()
	if c.shmSlow.Load() && !c.shmLearn.pays(l) {
		budget = 0 // the last wait outlasted a spin (see shmLink.slow)
	}
	for i := 0; ; i++ {
		need, ok := l.pollFrames()
		if !ok {
			l.handBack()
			return false, false
		}
		if c.ready.Load() > 0 || c.stopped() {
			took := l.answeredIn(beginAt, time.Now(), slept)
			c.shmSlow.Store(took > shmSpin)
			if expected {
				c.shmLearn.note(took)
			}
			l.keep()
			return true, false
		}
		if l.nwant.Load() > 0 {
			// Another waiter parked asking for the role; it reads
			// what this one waits for too.
			l.handBack()
			return false, true
		}
		// About to wait for the peer: ACKs of what was handled go now.
		// With a completion they stay coalesced: the application is
		// about to answer, and its reply carries them (sendAck).
		l.flushWake()
		if i%shmCPUPolls != 0 && budget > 0 {
			continue
		}
		select {
		case <-done:
			l.flushWake()
			l.keep()
			return true, false
		default:
		}
		now := l.node.now()
		switch {
		case time.Duration(now-begin) >= shmIdle:
			c.shmSlow.Store(true)
			l.handBack()
			return false, false
		case time.Duration(now-spin) >= budget:
			c.sleepShm(ctx, l, need, shmIdle-time.Duration(now-begin))
			slept = true
			spin = l.node.now()
		default:
			l.spinYield(i)
		}
	}
}

// sleepShm sleeps, for a waiter of c holding l's role, on l's futex word
// for at most d, unless the in ring holds need bytes: the peer's next
// frame, a completion from elsewhere (push), ctx's end or the link's death
// wakes it.
func (c *cq) sleepShm(ctx context.Context, l *shmLink, need uint64, d time.Duration) {
	c.watch(ctx)
	c.shmSleeper.Swap(l)
	if l.arm(sleepFutex, need) {
		if c.ready.Load() == 0 && !c.stopped() && ctx.Err() == nil {
			l.futexSleep(d)
		} else {
			l.seg.sleeping(l.side).CompareAndSwap(sleepFutex, 0)
		}
	}
	c.shmSleeper.Store(nil)
}

// pollShm reads c's lent shared-memory link for a poller, without waiting.
func (c *cq) pollShm(l *shmLink) {
	if !l.take() {
		return
	}
	if _, ok := l.pollFrames(); ok {
		l.flushWake() // as a TCP link's poller does (pollLink)
		l.keep()
	} else {
		l.handBack()
	}
}

// expecting reports whether a frame went either way on l within the last
// shmSpin: an exchange is under way (a request just posted, a message
// just answered), and the peer's next frame is due within a round trip.
// A wait then spins whatever the last waits took: those may have been
// slow only because the peer slept, and the peer sleeps because this
// side did, a cycle that one slow answer started and nothing ended.
func (l *shmLink) expecting() bool {
	return time.Duration(l.node.now()-l.active.Load()) < shmSpin
}

// shmSpinMisses is how many waits in a row, begun while an exchange was
// under way, must be answered later than a spin before such waits stop
// spinning; shmProbeEvery is how often one spins then all the same.
const (
	shmSpinMisses = 4
	shmProbeEvery = 16
)

// spinLearner learns whether the answers one kind of waiter on a link
// waits for come within a spin: the link's background reader (the next
// frame) and each CQ's waiters (a completion) learn apart, since a link
// can carry both at once, ACKs coming within microseconds and the
// application's answers later (smc's notified WRITEs).
type spinLearner struct {
	misses atomic.Int32  // waits in a row begun in an exchange answered after a spin
	probes atomic.Uint32 // waits since misses reached shmSpinMisses
}

// pays reports whether a wait on l that follows a slow one should spin:
// an exchange is under way and its answers have been coming within a
// spin. Where answers come later whatever the waiter does (an
// application that hops goroutines before it answers), a spin only takes
// the CPU the answer needs, so once shmSpinMisses such waits in a row
// missed, only one wait in shmProbeEvery spins, to find out whether
// answers come sooner again. A probe also ends the cycle of two sides
// that each sleep because the other answered late (see expecting): its
// side answers at once, and the peer, which judges by when it was rung
// (answeredIn), sees a hit.
func (s *spinLearner) pays(l *shmLink) bool {
	if !l.expecting() {
		return false
	}
	if s.misses.Load() < shmSpinMisses {
		return true
	}
	return s.probes.Add(1)%shmProbeEvery == 0
}

// note counts a wait begun while an exchange was under way, answered took
// after it began. Waiters race on the count: it is a hint.
func (s *spinLearner) note(took time.Duration) {
	if took <= shmSpin {
		s.misses.Store(0)
		return
	}
	if m := s.misses.Load(); m < shmSpinMisses {
		s.misses.Store(m + 1)
	}
}
