package main

import (
	"context"
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
	s := &rpcStore{ln: ln, vals: &Values{m: map[string][]byte{}}, clients: map[int]*rpc.Client{}}
	srv := rpc.NewServer()
	if err := srv.Register(s.vals); err != nil {
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
	c, err := s.client(owner)
	if err != nil {
		return nil, err
	}
	var data []byte
	select {
	case call := <-c.Go("Values.Get", name, &data, nil).Done:
		return data, call.Error
	case <-ctx.Done():
		return nil, ctx.Err()
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
