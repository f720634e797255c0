package racekv

import (
	"bytes"
	"context"
	"fmt"

	"github.com/krcore/krcore/verbs"
)

// chunkSize is the heap space a client takes from a node at a time (one
// FETCH_ADD), and then hands out to its blocks itself.
const chunkSize = 64 << 10

// maxRetries bounds a Put's lost CASes in a row.
const maxRetries = 1000

// Client is one compute client's view of the table: a Memory per memory
// node. It is not safe for concurrent use; a process runs one per
// goroutine.
type Client struct {
	mems    []Memory
	g       Geometry
	heapEnd uint64
	chunks  []chunk // per node: the heap space taken and not yet used

	// BeforeCAS, if set, runs in a Put between its block WRITE and the
	// slot CAS that publishes it: crash tests kill the process there.
	BeforeCAS func()

	// buffers reused by every operation
	cb    [2][CombinedSize]byte
	ops   [2 + 2*2*BucketSlots]Op
	opPtr [2 + 2*2*BucketSlots]*Op
	blk   []byte
}

// chunk is heap space a client owns on one node: [next, end).
type chunk struct{ next, end uint64 }

// Open reads the table's header from the first memory node (one READ) and
// returns a client of mems, one per memory node in index order.
func Open(ctx context.Context, mems []Memory) (*Client, error) {
	if len(mems) == 0 {
		return nil, fmt.Errorf("racekv: no memory nodes: %w", verbs.ErrInvalid)
	}
	h := make([]byte, HeaderSize)
	if err := mems[0].Do(ctx, &Op{Kind: verbs.OpRead, Buf: h}); err != nil {
		return nil, fmt.Errorf("racekv: read the table header: %w", err)
	}
	g, end, err := parseHeader(h)
	if err != nil {
		return nil, err
	}
	if g.Nodes != len(mems) {
		return nil, fmt.Errorf("racekv: the table spans %d memory nodes, the client reaches %d: %w", g.Nodes, len(mems), ErrFormat)
	}
	c := &Client{mems: mems, g: g, heapEnd: end, chunks: make([]chunk, len(mems))}
	for i := range c.ops {
		c.opPtr[i] = &c.ops[i]
	}
	return c, nil
}

// Geometry is the table's shape.
func (c *Client) Geometry() Geometry { return c.g }

// Close closes every Memory.
func (c *Client) Close() error {
	var first error
	for _, m := range c.mems {
		if err := m.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// found is where a lookup found a key: its slot's offset and value.
type found struct {
	at  uint64
	val slot
	ok  bool
}

// readBuckets reads the key's two combined buckets (one READ when both
// are the same).
func (c *Client) readBuckets(ctx context.Context, p place) error {
	n := 2
	if p.buckets[0] == p.buckets[1] {
		n = 1
	}
	for i := range n {
		c.ops[i] = Op{Kind: verbs.OpRead, Off: p.buckets[i], Buf: c.cb[i][:]}
	}
	if err := c.mems[p.node].Do(ctx, c.opPtr[:n]...); err != nil {
		return fmt.Errorf("racekv: read buckets: %w", err)
	}
	if n == 1 {
		c.cb[1] = c.cb[0]
	}
	return nil
}

// slotAt is slot i (0..15) of combined bucket b, as last read, and its
// offset.
func (c *Client) slotAt(p place, b, i int) (uint64, slot) {
	return p.buckets[b] + uint64(i*SlotSize), slot(words.Uint64(c.cb[b][i*SlotSize:]))
}

// lookup reads the buckets, then every block whose fingerprint matches,
// and returns the first slot, in bucket order, whose block holds key, and
// its value (a copy).
func (c *Client) lookup(ctx context.Context, p place, key []byte) (found, []byte, error) {
	if err := c.readBuckets(ctx, p); err != nil {
		return found{}, nil, err
	}
	var cands [2 * 2 * BucketSlots]found
	n, size := 0, 0
	for b := range 2 {
		if b == 1 && p.buckets[1] == p.buckets[0] {
			break
		}
		for i := range 2 * BucketSlots {
			at, s := c.slotAt(p, b, i)
			if s.isEmpty() || s.fp() != p.fp || s.size() == 0 {
				continue
			}
			cands[n] = found{at: at, val: s, ok: true}
			n++
			size += s.size()
		}
	}
	if n == 0 {
		return found{}, nil, nil
	}
	if cap(c.blk) < size {
		c.blk = make([]byte, size)
	}
	buf := c.blk[:size]
	for i, f := range cands[:n] {
		c.ops[i] = Op{Kind: verbs.OpRead, Off: f.val.off(), Buf: buf[:f.val.size()]}
		buf = buf[f.val.size():]
	}
	if err := c.mems[p.node].Do(ctx, c.opPtr[:n]...); err != nil {
		return found{}, nil, fmt.Errorf("racekv: read %d blocks: %w", n, err)
	}
	for i := range n {
		if k, v, ok := decodeBlock(c.ops[i].Buf); ok && bytes.Equal(k, key) {
			return cands[i], bytes.Clone(v), nil
		}
	}
	return found{}, nil, nil
}

// Get returns key's value, and whether the table holds key.
func (c *Client) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	f, v, err := c.lookup(ctx, placeOf(c.g, key), key)
	return v, f.ok, err
}

// Put sets key to val: it writes a new block and swings the key's slot to
// it, or takes an empty slot for a new key.
func (c *Client) Put(ctx context.Context, key, val []byte) error {
	size := blockSize(key, val)
	if len(key) > 0xffff || len(val) > 0xffff || size > MaxBlock {
		return fmt.Errorf("racekv: block of %d B for a %d B key and a %d B value (max %d B): %w", size, len(key), len(val), MaxBlock, ErrTooLarge)
	}
	p := placeOf(c.g, key)
	off, err := c.alloc(ctx, p.node, size)
	if err != nil {
		return err
	}
	blk := make([]byte, size)
	encodeBlock(blk, key, val)
	if err := c.mems[p.node].Do(ctx, &Op{Kind: verbs.OpWrite, Off: off, Buf: blk}); err != nil {
		return fmt.Errorf("racekv: write block: %w", err)
	}
	mine := makeSlot(p.fp, size/BlockUnit, off)
	if c.BeforeCAS != nil {
		c.BeforeCAS()
	}
	for range maxRetries {
		f, _, err := c.lookup(ctx, p, key)
		if err != nil {
			return err
		}
		if f.ok { // an update: swing the slot
			if ok, err := c.cas(ctx, p.node, f.at, f.val, mine); err != nil || ok {
				return err
			}
			continue
		}
		at, ok := c.emptySlot(p)
		if !ok {
			return fmt.Errorf("racekv: no empty slot in the two buckets of a key: %w", ErrFull)
		}
		if won, err := c.cas(ctx, p.node, at, 0, mine); err != nil || !won {
			if err != nil {
				return err
			}
			continue
		}
		// A concurrent insert of the same key may hold an earlier slot:
		// the first in bucket order stays, so give ours up and update it.
		first, _, err := c.lookup(ctx, p, key)
		if err != nil || !first.ok || first.at == at {
			return err
		}
		if _, err := c.cas(ctx, p.node, at, mine, 0); err != nil {
			return err
		}
	}
	return fmt.Errorf("racekv: put: %w", ErrContention)
}

// emptySlot picks an empty slot of the less loaded combined bucket, as
// last read, main bucket first.
func (c *Client) emptySlot(p place) (uint64, bool) {
	var free [2][]int
	for b := range 2 {
		// Side 0's main bucket is its first half, side 1's its second.
		order := []int{0, 1}
		if (p.buckets[b]-HeaderSize)%GroupSize != 0 {
			order = []int{1, 0}
		}
		for _, half := range order {
			for i := half * BucketSlots; i < (half+1)*BucketSlots; i++ {
				if _, s := c.slotAt(p, b, i); s.isEmpty() {
					free[b] = append(free[b], i)
				}
			}
		}
	}
	b := 0
	if len(free[1]) > len(free[0]) {
		b = 1
	}
	if len(free[b]) == 0 {
		return 0, false
	}
	at, _ := c.slotAt(p, b, free[b][0])
	return at, true
}

// cas swings the slot at off on node from old to new, and reports whether
// it did.
func (c *Client) cas(ctx context.Context, node int, off uint64, old, new slot) (bool, error) {
	op := Op{Kind: verbs.OpCompareSwap, Off: off, Compare: uint64(old), Swap: uint64(new)}
	if err := c.mems[node].Do(ctx, &op); err != nil {
		return false, fmt.Errorf("racekv: CAS slot at %d: %w", off, err)
	}
	return op.Old == uint64(old), nil
}

// alloc returns the offset of size bytes of node's heap, taking a new
// chunk with one FETCH_ADD when the client's is used up.
func (c *Client) alloc(ctx context.Context, node, size int) (uint64, error) {
	ch := &c.chunks[node]
	if ch.end-ch.next < uint64(size) {
		op := Op{Kind: verbs.OpFetchAdd, Off: hHeapTop * 8, Compare: chunkSize}
		if err := c.mems[node].Do(ctx, &op); err != nil {
			return 0, fmt.Errorf("racekv: take heap space: %w", err)
		}
		if op.Old+chunkSize > c.heapEnd {
			return 0, fmt.Errorf("racekv: memory node %d's heap is used up: %w", node, ErrFull)
		}
		*ch = chunk{next: op.Old, end: op.Old + chunkSize}
	}
	off := ch.next
	ch.next += uint64(size)
	return off, nil
}
