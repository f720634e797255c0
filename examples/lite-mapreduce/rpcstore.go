package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"sync"

	"github.com/krcore/krcore/internal/liteapp"
)

// rpcStore moves the job's data through Go net/rpc over TCP: a process
// keeps the values it publishes and serves them (Values.Get); a consumer
// calls its owner. Process p listens at peers.Addrs[p]. This file, with
// liteapp's Peers, Barriers and ServeRPC, is the whole of the word count's
// net/rpc code, the counterpart of liteStore.
type rpcStore struct {
	ln    net.Listener
	vals  *Values
	bars  *liteapp.Barriers
	peers liteapp.Peers
}

// Values serves a process's published values over net/rpc.
type Values struct {
	mu sync.Mutex
	m  map[string][]byte
}

// Get returns the value published under name.
func (v *Values) Get(name string, out *[]byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	data, ok := v.m[name]
	if !ok {
		return fmt.Errorf("no value %q", name)
	}
	*out = data
	return nil
}

func newRPCStore() (*rpcStore, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &rpcStore{ln: ln, vals: &Values{m: map[string][]byte{}}, bars: liteapp.NewBarriers()}
	srv := rpc.NewServer()
	if err := errors.Join(srv.Register(s.vals), srv.Register(s.bars)); err != nil {
		ln.Close()
		return nil, err
	}
	go liteapp.ServeRPC(srv, ln) // until close closes ln
	return s, nil
}

func (s *rpcStore) publish(_ context.Context, name string, data []byte) error {
	s.vals.mu.Lock()
	defer s.vals.mu.Unlock()
	s.vals.m[name] = data
	return nil
}

func (s *rpcStore) fetch(ctx context.Context, owner int, name string) ([]byte, error) {
	var data []byte
	return data, s.peers.Call(ctx, owner, "Values.Get", name, &data)
}

func (s *rpcStore) barrier(ctx context.Context, name string, n int) error {
	return s.peers.Arrive(ctx, name, n)
}

func (s *rpcStore) close() error {
	s.peers.Close()
	return s.ln.Close()
}
