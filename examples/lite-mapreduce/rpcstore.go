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
// calls its owner. Process p listens at addrs[p]. This file is the whole of
// the word count's net/rpc code, the counterpart of liteStore.
type rpcStore struct {
	ln    net.Listener
	vals  *Values
	bars  *liteapp.Barriers
	addrs []string

	mu      sync.Mutex
	clients map[int]*rpc.Client
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
	s := &rpcStore{ln: ln, vals: &Values{m: map[string][]byte{}}, bars: liteapp.NewBarriers(), clients: map[int]*rpc.Client{}}
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
	return data, s.call(ctx, owner, "Values.Get", name, &data)
}

func (s *rpcStore) barrier(ctx context.Context, name string, n int) error {
	return s.call(ctx, 0, "Barriers.Arrive", liteapp.Arrival{Name: name, N: n}, &struct{}{})
}

// call calls method at process owner.
func (s *rpcStore) call(ctx context.Context, owner int, method string, args, reply any) error {
	c, err := s.client(owner)
	if err != nil {
		return err
	}
	select {
	case call := <-c.Go(method, args, reply, nil).Done:
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

// client is the connection to process owner, dialled on first use.
func (s *rpcStore) client(owner int) (*rpc.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.clients[owner]; c != nil {
		return c, nil
	}
	c, err := rpc.Dial("tcp", s.addrs[owner])
	if err != nil {
		return nil, err
	}
	s.clients[owner] = c
	return c, nil
}

func (s *rpcStore) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.clients {
		c.Close()
	}
	return s.ln.Close()
}
