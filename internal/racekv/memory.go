package racekv

import (
	"context"
	"fmt"
	"sync"

	"github.com/krcore/krcore/verbs"
)

// Op is one one-sided operation on a memory node's region.
type Op struct {
	// Kind is verbs.OpRead, OpWrite, OpCompareSwap or OpFetchAdd.
	Kind verbs.Opcode
	// Off is the offset in the region (8-aligned for atomics).
	Off uint64
	// Buf receives a READ's bytes or holds a WRITE's.
	Buf []byte
	// Compare and Swap are CAS's operands; Compare is FETCH_ADD's addend.
	Compare, Swap uint64
	// Old receives an atomic's original value.
	Old uint64
}

// Memory is one memory node's region as a client reaches it.
type Memory interface {
	// Do runs ops, posted together, and returns once all completed: the
	// first failure, if any. After a failure of the transport itself (not
	// of an operation), requests may still be in flight: close the
	// Memory. It is not safe for concurrent use.
	Do(ctx context.Context, ops ...*Op) error
	// Close releases what the client holds for the node.
	Close() error
}

// scratchSize bounds the bytes one Do moves (the transports copy through
// a registered buffer of this size).
const scratchSize = 64 << 10

// maxBatch bounds the operations one Do posts.
const maxBatch = 64

// batchBytes is the scratch space ops need, or an error if they do not
// fit one Do.
func batchBytes(ops []*Op) (int, error) {
	n := 0
	for _, op := range ops {
		switch op.Kind {
		case verbs.OpRead, verbs.OpWrite:
			n += len(op.Buf)
		case verbs.OpCompareSwap, verbs.OpFetchAdd:
			n += 8
		default:
			return 0, fmt.Errorf("racekv: operation %s: %w", op.Kind, verbs.ErrInvalid)
		}
	}
	if n > scratchSize || len(ops) > maxBatch {
		return 0, fmt.Errorf("racekv: %d operations of %d B in one batch (max %d, %d B): %w", len(ops), n, maxBatch, scratchSize, ErrTooLarge)
	}
	return n, nil
}

// Local is a region in this process's memory, reached by copying: the
// memory node loads its table through it, and tests run on it. Its
// operations are atomic with one another; they are not with RDMA traffic
// to the same bytes.
type Local struct {
	mu  sync.Mutex
	mem []byte
}

// NewLocal reaches mem.
func NewLocal(mem []byte) *Local { return &Local{mem: mem} }

// Do runs ops in order under the region's lock.
func (l *Local) Do(ctx context.Context, ops ...*Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := batchBytes(ops); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, op := range ops {
		n := uint64(opLen(op))
		if op.Off > uint64(len(l.mem)) || n > uint64(len(l.mem))-op.Off || (op.Kind.IsAtomic() && op.Off%8 != 0) {
			return fmt.Errorf("racekv: %s of %d B at %d in a %d B region: %w", op.Kind, n, op.Off, len(l.mem), verbs.RemAccessErr)
		}
		b := l.mem[op.Off : op.Off+n]
		switch op.Kind {
		case verbs.OpRead:
			copy(op.Buf, b)
		case verbs.OpWrite:
			copy(b, op.Buf)
		case verbs.OpCompareSwap:
			if op.Old = words.Uint64(b); op.Old == op.Compare {
				words.PutUint64(b, op.Swap)
			}
		case verbs.OpFetchAdd:
			op.Old = words.Uint64(b)
			words.PutUint64(b, op.Old+op.Compare)
		}
	}
	return nil
}

// Close does nothing: the memory is the caller's.
func (l *Local) Close() error { return nil }

// opLen is the bytes op moves through a transport's scratch buffer.
func opLen(op *Op) int {
	if op.Kind.IsAtomic() {
		return 8
	}
	return len(op.Buf)
}

// unstage copies the results of ops, completed through buf with each op's
// bytes after the previous one's, into the ops: READ data and atomics'
// original values.
func unstage(ops []*Op, buf []byte) {
	at := 0
	for _, op := range ops {
		switch op.Kind {
		case verbs.OpRead:
			copy(op.Buf, buf[at:])
		case verbs.OpCompareSwap, verbs.OpFetchAdd:
			op.Old = words.Uint64(buf[at:])
		}
		at += opLen(op)
	}
}
