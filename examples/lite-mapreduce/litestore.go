package main

import (
	"context"
	"encoding/binary"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
)

// liteStore moves the job's data through LITE: a process publishes a value
// as an LMR it masters (a length, then the bytes), and a consumer maps it
// by name at its owner's node and reads it with one-sided RDMA. Process p
// is node p+1. This file is the whole of the word count's LITE code.
type liteStore struct{ n *lite.Node }

func newLiteStore(ctx context.Context, api krcore.API) (*liteStore, error) {
	n, err := lite.Open(ctx, api, lite.Options{})
	return &liteStore{n}, err
}

func (s *liteStore) publish(ctx context.Context, name string, data []byte) error {
	l, err := s.n.Malloc(ctx, name, 8+len(data), lite.Read)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(l.Bytes(), uint64(len(data)))
	copy(l.Bytes()[8:], data)
	return nil
}

func (s *liteStore) fetch(ctx context.Context, owner int, name string) ([]byte, error) {
	h, err := s.n.Map(ctx, krcore.NodeID(owner+1), name, lite.Read)
	if err != nil {
		return nil, err
	}
	defer s.n.Unmap(ctx, h)
	var size [8]byte
	if err := s.n.Read(ctx, h, 0, size[:]); err != nil {
		return nil, err
	}
	data := make([]byte, binary.LittleEndian.Uint64(size[:]))
	return data, s.n.Read(ctx, h, 8, data)
}

func (s *liteStore) barrier(ctx context.Context, name string, n int) error {
	return s.n.Barrier(ctx, 1, name, n)
}

func (s *liteStore) close() error { return s.n.Close() } // frees the LMRs
