//go:build linux

package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/krcore/krcore/offheap"
)

// The shared-memory link's segment: one memfd, made by the dialer and
// mapped by both processes, holding a control page and two byte rings, one
// per direction (ring 0 carries the dialer's frames to the acceptor, ring
// 1 the acceptor's to the dialer). A ring carries the same frames a TCP
// stream does (4-byte length, 64-byte header, payload), requests and
// responses alike, written at the producer's tail and read at the
// consumer's head, both free-running byte counts. A frame larger than the
// ring streams through it.
//
// Control page, one 64-byte line per word so the two processes do not
// share lines they both write:
//
//	line 0  magic, ring size
//	line 1+4d  ring d's tail (producer's)
//	line 2+4d  ring d's head (consumer's)
//	line 3+4d  ring d's wantSpace: its producer has frames queued for room
//	line 9+s   side s's sleeping: side s's reader waits on its doorbell
//	line 11+s  side s's export table: descriptor+1, inode, size (shmplace.go)
//	line 13+s  side s's in-place copies running in the other's memory
//	line 15    closing: a side is finishing the link, no copy may start
//	line 16+s  when side s's reader was last rung awake (answeredIn)
//	line 18+s  side s's alive word (shmalive.go)
//	line 20+s  side s's spinner word: the CPU its reader last spun on (spinYield)
//
// A reader with nothing to do spins for shmSpin, then sleeps: on a futex
// on its sleeping word (1) while the link was busy within shmIdle, a wake
// the kernel delivers to the very thread; on an idle link it sleeps
// reading the link's unix socket (2), the doorbell, so that idle links
// hold no thread (the runtime's poller waits for them all). A writer that
// publishes a tail or head and finds the other side sleeping clears the
// word and wakes it the way it sleeps. The socket is also the link's
// liveness: a peer process that dies closes it, and the survivor's reader
// sees the end of the stream once it sleeps there.
const (
	shmMagic   = 0x6b72736f66747368 // "krsoftsh"
	shmCtlSize = 4096
	shmLine    = 64
)

// ShmRingSize is the size of each of a shared-memory link's two rings:
// what one side may have written that the other has not read yet. Bytes
// beyond it wait in the sender's queue.
const ShmRingSize = 1 << 20

// ShmSegmentSize is the memory a shared-memory link maps in each of its
// two processes (one memfd, off the Go heap): a control page and the
// rings. Its pages are allocated as the rings are first used.
const ShmSegmentSize = shmCtlSize + 2*ShmRingSize

const (
	shmRingSize = ShmRingSize
	shmSegSize  = ShmSegmentSize
)

// shmSpin is how long a link's reader keeps looking for work before it
// sleeps: long enough to catch the answer to what was just sent (a round
// trip on the link is a few microseconds), short enough not to hold a
// core on a machine of two.
const shmSpin = 20 * time.Microsecond

// shmYieldPolls is how many polls a spinning reader makes between yields
// to the scheduler. A yield (runtime.Gosched) wakes an idle P's thread
// (wakep), which then spins looking for work itself: yielding at every
// poll kept a second thread spinning beside the reader, two spinners in
// one process on a machine of two cores, and took the core the peer
// process needed to answer. A rare yield still lets a goroutine queued
// behind the reader on its P run within a few microseconds.
const shmYieldPolls = 256

// shmOSYieldPolls is how many polls a spinning reader that does not know
// where the peer's reader runs makes between yields of its CPU to the
// kernel (sched_yield). A futex wake-up on a busy machine of two cores
// puts the woken peer on the waker's CPU (the kernel wakes affine when the
// other CPU is taken), so the peer that must answer often waits behind the
// very spinner waiting for the answer until the spin ends: without yields
// an 8 B SEND ping-pong at load 5-8 took 30-60 us a half round trip (every
// wait spun out and slept), with them 7 us (the two processes take turns
// on one CPU).
const shmOSYieldPolls = 64

// shmCPUPolls is how often, in polls, a spinning reader reads which CPU it
// runs on and where the peer's reader last ran (spinYield).
const shmCPUPolls = 16

// spinYield is called by a reader spinning on l at its polls-th poll
// (from 0). It yields the CPU to the kernel where that lets the peer
// answer sooner, and to the Go scheduler once every shmYieldPolls. Every
// shmCPUPolls polls it publishes the CPU it runs on (cpuNow, no system
// call) in this side's spinner word and reads the peer's:
//
//   - the peer's reader last ran on this CPU: what this reader waits for
//     waits for this CPU, so it yields at once, and again every
//     shmCPUPolls polls (two processes sharing one CPU take turns, a
//     context switch a hop);
//   - on another CPU: it never yields to the kernel. A sched_yield is a
//     system call, 1-3 us on these virtual machines (each traps), with
//     nothing to give the CPU to;
//   - unknown (the peer sleeps, or the CPU cannot be read): every
//     shmOSYieldPolls polls, since a wake-up may have put the peer here.
func (l *shmLink) spinYield(polls int) {
	if polls%shmCPUPolls == 0 {
		switch l.peerCPU() {
		case peerHere:
			osYield()
		case peerUnknown:
			if polls > 0 && polls%shmOSYieldPolls == 0 {
				osYield()
			}
		}
	}
	if polls > 0 && polls%shmYieldPolls == 0 {
		runtime.Gosched()
	}
}

// Where the peer's reader runs, as peerCPU tells.
const (
	peerUnknown = iota
	peerHere
	peerElsewhere
)

// peerCPU publishes the CPU this thread runs on as this side's spinner's
// and tells where the peer's spinner last ran: on this CPU, another, or
// unknown (it sleeps, or CPUs cannot be read). The peer's word is a hint:
// it says where the peer last spun, and the peer's thread may have moved
// since; a wrong hint costs at most the spin (shmSpin).
func (l *shmLink) peerCPU() int {
	me := cpuNow()
	if me < 0 {
		return peerUnknown
	}
	w := l.seg.spinCPU(l.side)
	if w.Load() != uint32(me)+1 {
		w.Store(uint32(me) + 1)
	}
	switch p := l.seg.spinCPU(1 - l.side).Load(); {
	case p == 0:
		return peerUnknown
	case p == uint32(me)+1:
		return peerHere
	default:
		return peerElsewhere
	}
}

// spinCPU is side's spinner word, control page line 20+side: the CPU its
// reader last spun on, plus one; 0 while it sleeps.
func (s *shmSeg) spinCPU(side int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(s.line(20 + side)))
}

// osYield gives this thread's CPU to another runnable thread, if any. A raw
// system call: it returns within microseconds, and the Go scheduler need
// not hand this thread's P to another meanwhile.
func osYield() {
	syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}

// shmWakeRoom is the room a consumer makes before it wakes a producer
// waiting for room: waking it for every few bytes freed would move a
// large frame in pieces that small, one wake-up each.
const shmWakeRoom = shmRingSize / 4

// shmIdle is how long after its last work a reader sleeps on the futex
// rather than the socket; a futex sleep ends after it, too. It is short
// because a futex wait is a system call that keeps its thread's P: with as
// many readers asleep on futexes as the process has Ps, no thread polls
// the network and nothing runs the goroutines readied on those Ps, until
// a wait ends or the runtime's monitor takes a P back, which on a quiet
// process it does every 10 ms. Past shmIdle a reader sleeps on the socket,
// parked, and a waiter reading the link hands its role back and parks.
const shmIdle = 200 * time.Microsecond

// shmFrameIdle is how long a reader in the middle of a frame, whose rest
// is due, keeps sleeping on the futex (shmIdle at a time) after its last
// work. With shmIdle there too, client's TestReclaimDrains hung with such
// a reader asleep on the socket (MEASUREMENTS.md, "krcored's Ps held by
// futex sleeps"); why the socket sleep matters there is not known.
const shmFrameIdle = 5 * time.Millisecond

// How a side's reader sleeps (its sleeping word).
const (
	sleepFutex = 1
	sleepSock  = 2
)

// errShmDead is a read of a link that failed.
var errShmDead = errors.New("soft: shared-memory link closed")

// shmSeg is a mapped segment.
type shmSeg struct {
	blk  *offheap.Block
	mem  []byte
	ring [2][]byte
}

// mapSeg lays out a mapped segment, checking the dialer's header.
func mapSeg(blk *offheap.Block, fresh bool) (*shmSeg, error) {
	mem := blk.Bytes()
	if len(mem) < shmSegSize {
		return nil, fmt.Errorf("soft: shm segment of %d bytes, want %d", len(mem), shmSegSize)
	}
	s := &shmSeg{blk: blk, mem: mem}
	s.ring[0] = mem[shmCtlSize : shmCtlSize+shmRingSize : shmCtlSize+shmRingSize]
	s.ring[1] = mem[shmCtlSize+shmRingSize : shmSegSize : shmSegSize]
	if fresh {
		s.word(0).Store(shmMagic)
		s.word(0 + 8/8).Store(shmRingSize) // line 0, second word
		return s, nil
	}
	if s.word(0).Load() != shmMagic || s.word(1).Load() != shmRingSize {
		return nil, fmt.Errorf("soft: shm segment has magic %#x, ring size %d", s.word(0).Load(), s.word(1).Load())
	}
	return s, nil
}

// word is the 8-byte word at index i of the control page (line i/8).
func (s *shmSeg) word(i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[8*i]))
}

func (s *shmSeg) line(l int) *atomic.Uint64 { return s.word(l * shmLine / 8) }
func (s *shmSeg) tail(d int) *atomic.Uint64 { return s.line(1 + 4*d) }
func (s *shmSeg) head(d int) *atomic.Uint64 { return s.line(2 + 4*d) }
func (s *shmSeg) want(d int) *atomic.Uint64 { return s.line(3 + 4*d) }
func (s *shmSeg) sleeping(side int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(s.line(9 + side)))
}

// copyIn copies p into ring d at byte position pos.
func (s *shmSeg) copyIn(d int, pos uint64, p []byte) {
	r := s.ring[d]
	n := copy(r[pos%shmRingSize:], p)
	copy(r, p[n:])
}

// copyOut copies from ring d at byte position pos into p.
func (s *shmSeg) copyOut(d int, pos uint64, p []byte) {
	r := s.ring[d]
	n := copy(p, r[pos%shmRingSize:])
	copy(p[n:], r)
}

// shmLink is a link to a node in another process of this host over a
// shared segment. Its reader goroutine reads and handles what the peer
// sends; anyone sends.
type shmLink struct {
	node *Node
	addr string // the peer's fabric address

	// Guarded by node.linkMu until up.
	dialing  bool
	lastFail time.Time
	why      error // why the last attempt failed: routes use TCP
	waiters  []*qp
	up       bool

	seg     *shmSeg
	conn    *net.UnixConn
	rc      syscall.RawConn
	bellFn  func(fd uintptr) bool // writeBell, made once: a method value allocates
	side    int                   // 0: this node dialled; 1: it accepted
	in, out int                   // ring numbers
	dead    atomic.Bool

	wmu      sync.Mutex
	hdr      [4 + headerLen]byte
	queued   shmQueue // what did not fit in the out ring yet, in order
	wake     [1]byte
	pending  atomic.Bool // the queue is not empty
	unrung   atomic.Bool // sendAck left the peer asleep (flushWake)
	held     []*qp       // QPs whose pumps held off while it is; guarded by wmu
	nheld    atomic.Int32
	unmapped bool // the segment is gone; guarded by wmu
	rdHeader [4 + headerLen]byte
	f        frame
	left     uint32 // payload bytes of the frame being handled, unread
	bell     [64]byte
	busy     time.Time // when the reader last found work
	// active is node.now() when this side last sent a frame or handled
	// one: an exchange is under way (expecting).
	active atomic.Int64
	// slow: the last wait for a frame outlasted a spin. Spinning is
	// adaptive, as a mutex's: on a machine of two cores shared with other
	// work, a spinner that keeps missing takes the core its peer needs and
	// ages its own claim on the scheduler, so waits that outlast shmSpin
	// make the next wait sleep at once (the peer's frame wakes it); one
	// the peer answered sooner turns spinning back on. A wait that slept
	// is judged by when the peer rang (answeredIn), not when this side
	// woke: else one idle spell (a TCP block of an interleaved benchmark)
	// kept every later wait asleep, each outlasting a spin by its own
	// wake-up. A wait while an exchange is under way (expecting) spins
	// while that pays (learn).
	slow  bool
	learn spinLearner

	// The read role (shmrole.go): who may consume the in ring and use
	// the reader's fields above (rdHeader, f, left, bell, busy).
	role     atomic.Int32  // shmRole*
	roleSeq  atomic.Uint32 // the background reader sleeps on it without the role
	lentAt   atomic.Int64  // node.now() when the role was last lent
	asked    atomic.Bool   // a waiter asked for the role since it was last lent
	nwant    atomic.Int32  // len(wanters)
	yielders atomic.Int32  // waiters that gave the role up to one that asked
	rmu      sync.Mutex
	wanters  []*cq // waiters parked asking for the role, rung when it is lent

	// In-place access (shmplace.go). segMu is read-held by whoever uses
	// the segment's in-place words or the mappings of the peer's memory,
	// and held by finish to drop them (segGone).
	segMu   sync.RWMutex
	segGone bool
	place   placer
	pid     int // the peer process, from the socket
	pidfd   int // -1 if none
}

func (l *shmLink) peer() string { return l.addr }

// free is the room in the out ring.
func (l *shmLink) free() uint64 {
	s := l.seg
	return shmRingSize - (s.tail(l.out).Load() - s.head(l.out).Load())
}

// send copies a frame into the out ring, queueing what does not fit: a
// sender never waits for the peer (see write.go for why the link's reader,
// which sends too, must not).
func (l *shmLink) send(f *frame) { l.sendFrame(f, false) }

// sendAck sends a plain ACK of an RC or DC WRITE or SEND without waking
// the peer's reader if it sleeps: the ACK is in the ring at once (a
// spinning peer sees it), and the wake-up waits for whatever this side
// sends next (the application's reply to the SEND, in the same wake-up)
// or for this side's reader to find the ring empty (flushWake). As on a
// TCP link (sendAck there), the peer then wakes once per reply, not once
// for the ACK and again for the reply: on a loaded machine of two cores
// each wake-up costs tens of microseconds.
func (l *shmLink) sendAck(f *frame) { l.sendFrame(f, true) }

// sendFrame is send, leaving the peer asleep if lazy.
func (l *shmLink) sendFrame(f *frame, lazy bool) {
	if l.dead.Load() {
		return
	}
	plen := f.payloadLen()
	l.wmu.Lock()
	if l.dead.Load() {
		l.wmu.Unlock()
		return
	}
	f.putHeader(l.hdr[:], plen)
	l.drainLocked()
	l.put(l.hdr[:])
	for _, s := range f.segs {
		l.put(s)
	}
	l.active.Store(l.node.now())
	if lazy && l.queued.empty() {
		if l.seg.sleeping(1-l.side).Load() != 0 {
			l.unrung.Store(true)
		}
	} else {
		l.publishLocked()
	}
	l.wmu.Unlock()
	l.pumpHeld()
}

// flushWake wakes the peer's reader for ACKs sendAck left unrung.
func (l *shmLink) flushWake() {
	if l.unrung.Load() && l.unrung.Swap(false) {
		l.ring(1 - l.side)
	}
}

// put appends p to the out ring or, once anything is queued, the queue.
func (l *shmLink) put(p []byte) {
	if l.queued.empty() {
		s := l.seg
		t := s.tail(l.out).Load()
		k := min(uint64(len(p)), l.free())
		s.copyIn(l.out, t, p[:k])
		s.tail(l.out).Store(t + k)
		p = p[k:]
	}
	l.queued.push(p)
}

// drainLocked moves queued bytes into the out ring as room allows; l.wmu
// is held.
func (l *shmLink) drainLocked() {
	s := l.seg
	for !l.queued.empty() {
		room := l.free()
		if room == 0 {
			return
		}
		c := l.queued.front()
		k := min(uint64(len(c)), room)
		t := s.tail(l.out).Load()
		s.copyIn(l.out, t, c[:k])
		s.tail(l.out).Store(t + k)
		l.queued.pop(int(k))
	}
}

// holdOff reports whether q's pump should stop before its next request
// because output is queued for room in the out ring; if so, q is pumped
// again once the queue has drained (pumpHeld). As on a TCP link (write.go),
// requesters fetch requests only as fast as the ring takes them, so a
// stream of large WRITEs or SENDs is copied from registered memory into
// the ring, not into the queue first. q.mu is held.
func (l *shmLink) holdOff(q *qp) bool {
	if l.dead.Load() || !l.pending.Load() {
		return false
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.queued.empty() || l.unmapped {
		return false
	}
	if len(l.held) == 0 || l.held[len(l.held)-1] != q {
		l.held = append(l.held, q)
		l.nheld.Store(int32(len(l.held)))
	}
	return true
}

// pumpHeld pumps the QPs that held off, once the queue has drained or the
// link died (their requests then time out). The caller holds no QP lock:
// it is a sender, or a reader between frames.
func (l *shmLink) pumpHeld() {
	if l.nheld.Load() == 0 {
		return
	}
	l.wmu.Lock()
	if !l.queued.empty() && !l.dead.Load() {
		l.wmu.Unlock()
		return
	}
	held := l.held
	l.held = nil
	l.nheld.Store(0)
	l.wmu.Unlock()
	for _, q := range held {
		q.pump()
	}
}

// shmQueue holds bytes for the out ring in chunks, copied: a large burst
// moves each byte in and out once.
type shmQueue struct {
	chunks [][]byte
	off    int // consumed bytes of chunks[0]
}

// shmChunk is the size of a queue chunk, besides larger payloads' own.
const shmChunk = 64 << 10

func (q *shmQueue) empty() bool { return len(q.chunks) == 0 }

// push appends a copy of p.
func (q *shmQueue) push(p []byte) {
	if len(p) == 0 {
		return
	}
	if n := len(q.chunks); n > 0 {
		last := q.chunks[n-1]
		if k := min(cap(last)-len(last), len(p)); k > 0 {
			q.chunks[n-1] = append(last, p[:k]...)
			p = p[k:]
		}
	}
	if len(p) > 0 {
		q.chunks = append(q.chunks, append(make([]byte, 0, max(len(p), shmChunk)), p...))
	}
}

func (q *shmQueue) front() []byte { return q.chunks[0][q.off:] }

// pop drops k bytes of the front chunk.
func (q *shmQueue) pop(k int) {
	q.off += k
	if q.off == len(q.chunks[0]) {
		q.chunks[0] = nil
		q.chunks = q.chunks[1:]
		q.off = 0
		if len(q.chunks) == 0 {
			q.chunks = nil
		}
	}
}

// publishLocked tells the peer about what was written: it wakes the peer's
// reader if it sleeps, and, with bytes still queued, asks the peer to ring
// when it makes room. l.wmu is held.
func (l *shmLink) publishLocked() {
	s := l.seg
	if !l.queued.empty() {
		l.pending.Store(true)
		s.want(l.out).Store(1)
		// Room made between the copy and the store above rang nobody.
		l.drainLocked()
	}
	if l.queued.empty() {
		l.pending.Store(false)
	} else if l.role.Load() == shmRoleLent {
		l.kickReader() // nobody reads the link to move the queue on
	}
	l.unrung.Store(false)
	l.ring(1 - l.side)
}

// ring wakes side's reader if it sleeps.
func (l *shmLink) ring(side int) {
	w := l.seg.sleeping(side)
	if w.Load() == 0 {
		return
	}
	how := w.Swap(0)
	if how != 0 {
		l.seg.rungAt(side).Store(time.Now().UnixNano())
	}
	switch how {
	case sleepFutex:
		futexWake(w)
	case sleepSock:
		l.rc.Write(l.bellFn)
	}
}

// rungAt is when side's reader was last rung awake (wall-clock
// nanoseconds, which both processes read alike), control page line 16+side.
func (s *shmSeg) rungAt(side int) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Pointer(s.line(16 + side)))
}

// answeredIn is how long the peer took to send what ended a wait that
// began at from and ended at end. A wait that slept ended only once this
// side's reader woke, which on a loaded machine of two cores takes tens
// of microseconds more; the peer's stamp of when it rang says when the
// answer came, so that an answer a spin would have caught turns spinning
// back on (see slow) instead of keeping every later wait asleep.
func (l *shmLink) answeredIn(from, end time.Time, slept bool) time.Duration {
	if slept {
		if r := time.Unix(0, l.seg.rungAt(l.side).Load()); !r.Before(from) && r.Before(end) {
			return r.Sub(from)
		}
	}
	return end.Sub(from)
}

// Futex operations (linux/futex.h), process-shared.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w is v, for at most d (a process-shared futex:
// the word is in the segment).
func futexWait(w *atomic.Uint32, v uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes the sleeper on w.
func futexWake(w *atomic.Uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, 1, 0, 0, 0)
}

// writeBell writes the doorbell byte; a full socket holds wakes already.
func (l *shmLink) writeBell(fd uintptr) bool {
	syscall.Write(int(fd), l.wake[:])
	return true
}

// avail is how many bytes the in ring holds.
func (l *shmLink) avail() uint64 {
	s := l.seg
	return s.tail(l.in).Load() - s.head(l.in).Load()
}

// consume reads len(p) bytes from the in ring, which holds them, and tells
// a peer waiting for room.
func (l *shmLink) consume(p []byte) {
	s := l.seg
	h := s.head(l.in).Load()
	s.copyOut(l.in, h, p)
	s.head(l.in).Store(h + uint64(len(p)))
	if s.want(l.in).Load() != 0 && shmRingSize-(s.tail(l.in).Load()-h-uint64(len(p))) >= shmWakeRoom && s.want(l.in).Swap(0) != 0 {
		l.ring(1 - l.side)
	}
}

// await waits until the in ring holds at least n bytes (at most the
// ring's size), moving queued output meanwhile. It spins for shmSpin,
// then sleeps on the doorbell; between frames (lend) it does not spin
// while the peer is slow (see slow). If lend (the background reader, between
// frames), it lends the read role to waiters that asked for it instead of
// waiting, returning errLent. Any other error means the link failed.
func (l *shmLink) await(n uint64, lend bool) error {
	var from, spun time.Time // when the wait began, when the spin did
	slept, polls := false, 0
	expected, spin := false, true // the wait began in an exchange; spin now
	for {
		if a := l.avail(); a >= n {
			if a > shmRingSize {
				return fmt.Errorf("%w: the peer's ring holds %d bytes", errShmDead, a)
			}
			l.busy = time.Now()
			if lend {
				took := l.answeredIn(from, l.busy, slept)
				l.slow = !from.IsZero() && took > shmSpin
				if expected {
					l.learn.note(took)
				}
			}
			return nil
		}
		if l.dead.Load() {
			return errShmDead
		}
		l.flushWake() // about to wait: ACKs go now
		if lend && l.asked.Load() {
			l.lend()
			return errLent
		}
		if l.pending.Load() {
			l.wmu.Lock()
			l.drainLocked()
			l.publishLocked()
			l.wmu.Unlock()
			l.busy = time.Now()
		}
		if lend {
			// Not in the middle of a frame, whose handler may hold
			// the QP lock a pump takes.
			l.pumpHeld()
		}
		if spun.IsZero() {
			spun = time.Now()
			if from.IsZero() {
				from = spun
				expected = lend && l.expecting()
			}
			spin = !(lend && l.slow) || l.learn.pays(l)
		}
		if spin && time.Since(spun) < shmSpin {
			l.spinYield(polls)
			polls++
			continue
		}
		if err := l.sleep(n, lend); err != nil {
			return err
		}
		slept = true
		spun = time.Time{}
	}
}

// sleep waits to be woken unless work came meanwhile; between frames
// (lend) on the socket once the link has been idle for shmIdle, in the
// middle of one for shmFrameIdle.
func (l *shmLink) sleep(n uint64, lend bool) error {
	how := uint32(sleepSock)
	if idle := time.Since(l.busy); idle < shmIdle || !lend && idle < shmFrameIdle {
		how = sleepFutex
	}
	if !l.arm(how, n) {
		return nil
	}
	if how == sleepFutex {
		l.futexSleep(shmIdle)
		return nil
	}
	k, err := l.conn.Read(l.bell[:])
	if err != nil || k == 0 {
		return fmt.Errorf("%w: %w", errShmDead, err)
	}
	return nil
}

// arm marks this side's reader asleep (how) and reports whether it may
// sleep: the in ring holds less than n bytes, queued output has no room to
// move into, and the link lives. If not, the mark is taken back.
func (l *shmLink) arm(how uint32, n uint64) bool {
	me := l.seg.sleeping(l.side)
	me.Swap(how)
	l.seg.spinCPU(l.side).Store(0) // the peer's spinners need not yield to it
	if l.pending.Load() {
		// The consumer clears the word when it rings, perhaps after
		// publishLocked set it again: set, with this side asleep.
		l.seg.want(l.out).Store(1)
	}
	if l.avail() >= n || l.pending.Load() && l.free() >= shmWakeRoom || l.dead.Load() {
		me.CompareAndSwap(how, 0)
		return false
	}
	return true
}

// futexSleep sleeps on this side's sleeping word, armed with sleepFutex,
// for at most d.
func (l *shmLink) futexSleep(d time.Duration) {
	me := l.seg.sleeping(l.side)
	// The wait is a blocking system call that keeps this goroutine's P,
	// and with it the goroutines it just readied (the waiter whose
	// completion or message it read) until Go's sysmon takes the P back:
	// tens to hundreds of microseconds. Let them run first; a ring
	// meanwhile clears the word and the wait returns at once.
	runtime.Gosched()
	futexWait(me, sleepFutex, d)
	me.CompareAndSwap(sleepFutex, 0)
}

// wakeSelf wakes this side's reader if it sleeps on the futex, unless the
// segment is gone.
func (l *shmLink) wakeSelf() {
	l.wmu.Lock() // the reader unmaps the segment under it
	if !l.unmapped {
		if w := l.seg.sleeping(l.side); w.CompareAndSwap(sleepFutex, 0) {
			futexWake(w)
		}
	}
	l.wmu.Unlock()
}

// ready waits until Read has a byte of the payload at least without
// waiting (see payloadStream).
func (l *shmLink) ready() error {
	if l.left == 0 {
		return nil
	}
	return l.await(1, false)
}

// Read reads the payload of the frame being handled, for its handler.
func (l *shmLink) Read(p []byte) (int, error) {
	if l.left == 0 {
		return 0, io.EOF
	}
	if uint32(len(p)) > l.left {
		p = p[:l.left]
	}
	if err := l.await(1, false); err != nil {
		return 0, err
	}
	k := min(uint64(len(p)), l.avail())
	l.consume(p[:k])
	l.left -= uint32(k)
	return int(k), nil
}

// readLoop is the link's background reader: it handles frames while it
// holds the read role (shmrole.go) until the link fails, then kills it and
// unmaps the segment.
func (l *shmLink) readLoop() {
	defer l.node.wg.Done()
	defer l.finish()
	for l.awaitRole() {
		err := l.await(uint64(len(l.rdHeader)), true)
		if err == errLent {
			continue
		}
		if err != nil || !l.handle() {
			return
		}
	}
}

// kill fails the link: its reader stops and unmaps the segment. Requests
// waiting on it time out with RETRY_EXC_ERR.
func (l *shmLink) kill() {
	if l.dead.Swap(true) {
		return
	}
	n := l.node
	n.linkMu.Lock()
	if n.shm[l.addr] == l {
		delete(n.shm, l.addr)
	}
	n.linkMu.Unlock()
	// Wakes the reader: a read of a shut socket ends.
	l.conn.CloseRead()
	l.conn.CloseWrite()
	l.wakeSelf()
	l.kickReader() // it may sleep without the role
}

// finish kills the link and, once no sender writes the segment and no
// waiter reads it, unmaps it. The background reader holds the read role or
// it is dead already: no waiter can take it any more.
func (l *shmLink) finish() {
	l.role.Store(shmRoleDead)
	l.kill()
	l.closePlace()
	l.wmu.Lock()
	l.queued = shmQueue{}
	l.unmapped = true
	l.seg.disarmAlive(l.side)
	l.seg.blk.Close()
	l.wmu.Unlock()
	l.conn.Close()
	l.pumpHeld()
}
