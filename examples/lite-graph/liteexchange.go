package main

import (
	"context"
	"encoding/binary"
	"math"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
)

// liteExchange shares the ranks through LITE: each worker mallocs one LMR
// of two slots (even and odd iterations), each the partition's dangling
// rank then its ranks, and writes its new ranks into its own memory; the
// others map it once and read a whole slot with one-sided RDMA every
// iteration; the workers meet at a Barrier mastered by the coordinator's
// node (node 1) after each. Worker p is node p+1. This file is the whole of the PageRank
// engine's LITE code.
type liteExchange struct {
	n    *lite.Node
	l    *lite.LMR
	size func(q int) int // ranks in worker q's partition
	h    map[int]lite.Handle
}

func newLiteExchange(ctx context.Context, api krcore.API, count int, size func(int) int) (*liteExchange, error) {
	n, err := lite.Open(ctx, api, lite.Options{})
	if err != nil {
		return nil, err
	}
	x := &liteExchange{n: n, size: size, h: map[int]lite.Handle{}}
	if count > 0 { // a worker's: the coordinator only reads
		x.l, err = n.Malloc(ctx, "ranks", 2*8*(1+count), lite.Read)
	}
	return x, err
}

func (x *liteExchange) set(slot int, dangling float64, ranks []float64) {
	b := x.l.Bytes()[slot*8*(1+len(ranks)):]
	for i, f := range append([]float64{dangling}, ranks...) {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(f))
	}
}

func (x *liteExchange) get(ctx context.Context, q, slot int, ranks []float64) (float64, error) {
	h, ok := x.h[q]
	if !ok {
		var err error
		if h, err = x.n.Map(ctx, krcore.NodeID(q+1), "ranks", lite.Read); err != nil {
			return 0, err
		}
		x.h[q] = h
	}
	b := make([]byte, 8*(1+x.size(q)))
	if err := x.n.Read(ctx, h, slot*len(b), b); err != nil {
		return 0, err
	}
	for i := range ranks {
		ranks[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8+8*i:]))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
}

func (x *liteExchange) barrier(ctx context.Context, name string, n int) error {
	return x.n.Barrier(ctx, 1, name, n)
}

func (x *liteExchange) close() error { return x.n.Close() }
