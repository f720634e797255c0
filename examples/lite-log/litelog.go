package main

import (
	"context"
	"encoding/binary"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
)

// liteLog is the log on LITE: an LMR at the coordinator's node (node 1)
// whose first 8-byte word is the tail; an appender reserves a record's
// space with one FetchAdd on the tail and writes the record there with one
// RDMA WRITE: no message to the log's node, no lock. This file is the
// whole of the log's LITE code.
type liteLog struct {
	n *lite.Node
	l *lite.LMR   // the coordinator's
	h lite.Handle // an appender's
}

// newLiteLog makes the log, of capacity bytes, at the coordinator.
func newLiteLog(ctx context.Context, api krcore.API, capacity int) (*liteLog, error) {
	n, err := lite.Open(ctx, api, lite.Options{})
	if err != nil {
		return nil, err
	}
	l, err := n.Malloc(ctx, "log", 8+capacity, lite.Read|lite.Write|lite.Atomic)
	return &liteLog{n: n, l: l}, err
}

// openLiteLog maps the log at node 1 for an appender.
func openLiteLog(ctx context.Context, api krcore.API) (*liteLog, error) {
	n, err := lite.Open(ctx, api, lite.Options{})
	if err != nil {
		return nil, err
	}
	h, err := n.Map(ctx, 1, "log", lite.Write|lite.Atomic)
	return &liteLog{n: n, h: h}, err
}

func (g *liteLog) append(ctx context.Context, rec []byte) error {
	off, err := g.n.FetchAdd(ctx, g.h, 0, uint64(len(rec)))
	if err != nil {
		return err
	}
	return g.n.Write(ctx, g.h, 8+int(off), rec) // past the end: ErrInvalid, the log is full
}

func (g *liteLog) contents() []byte {
	b := g.l.Bytes()
	return b[8 : 8+min(binary.LittleEndian.Uint64(b), uint64(len(b)-8))]
}

func (g *liteLog) close() error { return g.n.Close() }
