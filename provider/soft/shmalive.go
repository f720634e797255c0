//go:build linux

package soft

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A requester copying in place must not read or write the memory of a
// peer process that has died: an RNIC would find the responder's QP gone
// and fail the request (RETRY_EXC_ERR), and once the dead process is
// reaped its death must show at once, not when this side's link reader
// happens to notice it. The one thing the kernel writes into shared memory
// when a process dies is a robust futex: each thread's robust list names
// futex words that hold its thread id, and in do_exit, before the process
// can be reaped, the kernel sets FUTEX_OWNER_DIED in each. So every side
// arms, in each link's control page (line 18+side), a list entry and
// beside it a word holding the thread id of one thread of this process
// that lives as long as the process does; a requester loads the peer's
// word before each in-place copy.

const (
	futexOwnerDied = 0x40000000
	futexTIDMask   = 0x3fffffff
	// aliveLine is side s's entry line (aliveLine+s): the list entry's
	// next pointer (this process's addresses), then the futex word.
	aliveLine = 18
)

// robustHead is the kernel's struct robust_list_head.
type robustHead struct {
	next    uintptr // first entry; the head's own address when empty
	offset  int64   // from an entry to its futex word
	pending uintptr
}

// alive is the process's robust list and the thread that owns it.
var alive struct {
	once    sync.Once
	tid     uint32 // 0: no robust list (in-place access stays off)
	mu      sync.Mutex
	head    robustHead
	entries []*atomic.Uint64 // the list, in order; guarded by mu
}

// aliveTID starts, once, the thread whose robust list carries every
// link's alive word, and returns its thread id (0 if the kernel refused
// the list). The thread's goroutine never returns: its thread exiting
// would mark every link's word as if the process had died.
func aliveTID() uint32 {
	alive.once.Do(func() {
		ready := make(chan uint32)
		go func() {
			runtime.LockOSThread()
			alive.head.next = uintptr(unsafe.Pointer(&alive.head))
			alive.head.offset = 8
			_, _, errno := unix.RawSyscall(unix.SYS_SET_ROBUST_LIST, uintptr(unsafe.Pointer(&alive.head)), unsafe.Sizeof(alive.head), 0)
			if errno != 0 {
				ready <- 0
				return // unlocked exit is harmless: no list was set
			}
			ready <- uint32(unix.Gettid())
			select {}
		}()
		alive.tid = <-ready
	})
	return alive.tid
}

// aliveWord is side's futex word in s.
func (s *shmSeg) aliveWord(side int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(s.word((aliveLine+side)*shmLine/8 + 1)))
}

// armAlive puts side's alive word into the process's robust list; a
// process without one leaves it zero, which its peers read as dead. The
// kernel follows at most 2,048 entries: beyond that many links, a peer
// learns of this process's death only from its link (as before).
func (s *shmSeg) armAlive(side int) {
	tid := aliveTID()
	if tid == 0 {
		return
	}
	alive.mu.Lock()
	defer alive.mu.Unlock()
	s.aliveWord(side).Store(tid)
	alive.entries = append(alive.entries, s.aliveEntry(side))
	relinkAlive()
}

// disarmAlive takes side's entry out of the robust list, before the
// segment is unmapped (the kernel walks the list when the thread exits).
func (s *shmSeg) disarmAlive(side int) {
	e := s.aliveEntry(side)
	alive.mu.Lock()
	defer alive.mu.Unlock()
	if i := slices.Index(alive.entries, e); i >= 0 {
		alive.entries = slices.Delete(alive.entries, i, i+1)
		relinkAlive()
		s.aliveWord(side).Store(0)
	}
}

// relinkAlive writes alive.entries as the kernel's list: every entry's
// next first, the head last, so a walk at any moment finds a list that
// ends at the head. alive.mu held.
func relinkAlive() {
	next := uintptr(unsafe.Pointer(&alive.head))
	for i := len(alive.entries) - 1; i >= 0; i-- {
		alive.entries[i].Store(uint64(next))
		next = uintptr(unsafe.Pointer(alive.entries[i]))
	}
	alive.head.next = next
}

// aliveEntry is side's list entry in s: the word before its alive word.
func (s *shmSeg) aliveEntry(side int) *atomic.Uint64 {
	return s.word((aliveLine + side) * shmLine / 8)
}

// peerAlive reports whether side's process had not died when loaded.
func (s *shmSeg) peerAlive(side int) bool {
	w := s.aliveWord(side).Load()
	return w&futexTIDMask != 0 && w&futexOwnerDied == 0
}
