package lite

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// syncBufSize is the sync path's registered buffer: an atomic's original
// value, or a lock's state words.
const syncBufSize = 64

// syncer is the Node's path for atomics and lock polls, with its own queue
// and small buffer so that a lock's poll never waits behind a bulk Read on
// the data queue; the owner of the goroutines locks and barriers leave
// running (lease renewals, abandoned tickets handed on, barrier releases),
// which Close stops and waits for; and the barriers mastered here.
type syncer struct {
	mu  sync.Mutex // q, buf: one request at a time
	q   krcore.VQ  // nil until first use or after an abandoned request
	buf krcore.MR

	// qmu guards replacing q (done with mu held too) and stopping, so that
	// stop can close q while a request holds mu.
	qmu     sync.Mutex
	stopped bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	bmu      sync.Mutex
	barriers map[string]*barrier // mastered here, by name
}

// FetchAdd adds add to the 8-byte word at offset off of h's LMR with one
// RDMA atomic at the node holding it and returns the word's previous
// value. Words are little-endian; off must be 8-byte aligned. The master's
// node refuses it (REM_ACCESS_ERR) unless h was mapped with Atomic.
func (n *Node) FetchAdd(ctx context.Context, h Handle, off int, add uint64) (old uint64, err error) {
	return n.atomic(ctx, h, off, verbs.OpFetchAdd, add, 0)
}

// CompareSwap replaces the 8-byte word at offset off of h's LMR with swap
// if it equals compare, with one RDMA atomic at the node holding it, and
// returns the word's previous value (equal to compare when it swapped).
// Words are little-endian; off must be 8-byte aligned. The master's node
// refuses it (REM_ACCESS_ERR) unless h was mapped with Atomic.
func (n *Node) CompareSwap(ctx context.Context, h Handle, off int, compare, swap uint64) (old uint64, err error) {
	return n.atomic(ctx, h, off, verbs.OpCompareSwap, compare, swap)
}

// atomic checks off's alignment and runs one atomic on the word there.
func (n *Node) atomic(ctx context.Context, h Handle, off int, op verbs.Opcode, cmp, swap uint64) (uint64, error) {
	var b [8]byte
	err := fmt.Errorf("word at %d: %w", off, krcore.ErrInvalid)
	if off%8 == 0 {
		err = n.onSync(ctx, h, off, op, cmp, swap, b[:])
	}
	if err != nil {
		return 0, fmt.Errorf("lite: %s: %w", op, err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// onSync runs one request of the sync path on len(out) bytes at offset
// off of h's LMR, which must lie in one stripe: an atomic, or a READ.
func (n *Node) onSync(ctx context.Context, h Handle, off int, op verbs.Opcode, cmp, swap uint64, out []byte) error {
	return n.access(ctx, h, off, len(out), func(m *mapping) error {
		es := m.lay.extents(off, len(out), len(out))
		if len(es) != 1 {
			return fmt.Errorf("%d bytes at %d straddle stripes: %w", len(out), off, krcore.ErrInvalid)
		}
		at := m.regions[es[0].node].At(es[0].remote)
		if err := n.remote(ctx, m.lay.nodes[es[0].node], at, op, cmp, swap, out); err != nil {
			return fmt.Errorf("%q at %d: %w", m.name, off, err)
		}
		return nil
	})
}

// remote runs one request of the sync path at node: an atomic on the word
// at (out gets its original value), or a READ of len(out) bytes there.
func (n *Node) remote(ctx context.Context, node krcore.NodeID, at krcore.Remote, op verbs.Opcode, cmp, swap uint64, out []byte) error {
	s := &n.sync
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ready(n.api); err != nil {
		return err
	}
	if err := s.q.Connect(ctx, node, nil); err != nil {
		return err
	}
	req := krcore.Request{ID: 1, Op: op, Local: s.buf.Range(0, len(out)), Remote: at, Compare: cmp, Swap: swap}
	if err := s.q.PushOne(ctx, true, req); err != nil {
		return err
	}
	var c [1]krcore.Completion
	if _, err := s.q.PopWait(ctx, c[:]); err != nil {
		s.drop(n.api)
		return err
	}
	if err := c[0].Err(); err != nil {
		return err
	}
	copy(out, s.buf.Bytes())
	return nil
}

// ready makes the queue and buffer if there are none; mu held.
func (s *syncer) ready(api krcore.API) error {
	if s.q != nil {
		return nil
	}
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.stopped {
		return krcore.ErrClosed
	}
	b, err := api.RegMR(syncBufSize, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	q, err := api.Queue()
	if err != nil {
		api.Deregister(b)
		return err
	}
	s.q, s.buf = q, b
	return nil
}

// drop retires the queue and buffer after a request was abandoned: it may
// still be in flight, and must neither pin the queue to its node nor land
// in the buffer the next request uses. The next request makes new ones;
// mu held.
func (s *syncer) drop(api krcore.API) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.q != nil {
		s.q.Close()
		api.Deregister(s.buf) // released once the abandoned request ends
		s.q, s.buf = nil, nil
	}
}

// spawn runs f on a goroutine the Node owns, with a context stop cancels;
// false once stopped.
func (s *syncer) spawn(f func(ctx context.Context)) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.stopped {
		return false
	}
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
	ctx := s.ctx
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f(ctx)
	}()
	return true
}

// stop is Close's part for the sync path: it fails a request waiting on
// the queue with ErrClosed, stops the goroutines spawn started and waits
// for them, then releases the queue and buffer.
func (s *syncer) stop(api krcore.API) {
	s.qmu.Lock()
	s.stopped = true
	if s.q != nil {
		s.q.Close() // wakes a request waiting with mu held
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.qmu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop(api)
}
