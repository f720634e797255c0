package main

import (
	"context"
	"errors"
	"net"
	"net/rpc"
	"sync"

	"github.com/krcore/krcore/internal/liteapp"
)

// rpcExchange shares the ranks through Go net/rpc over TCP: each worker
// keeps its two slots and serves them (Ranks.Get); the others call it
// every iteration; the workers meet at the coordinator's net/rpc barrier
// (liteapp.Barriers) after each. Worker p listens at addrs[p]. This file is the whole of
// the engine's net/rpc code, the counterpart of liteExchange.
type rpcExchange struct {
	ln    net.Listener
	r     *Ranks
	addrs []string

	mu      sync.Mutex
	clients map[int]*rpc.Client
}

// Slot is one iteration's ranks of a partition.
type Slot struct {
	Dangling float64
	Ranks    []float64
}

// Ranks serves a worker's two slots.
type Ranks struct {
	mu    sync.Mutex
	slots [2]Slot
}

// Get returns slot s.
func (r *Ranks) Get(s int, out *Slot) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*out = r.slots[s]
	return nil
}

func newRPCExchange() (*rpcExchange, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	x := &rpcExchange{ln: ln, r: &Ranks{}, clients: map[int]*rpc.Client{}}
	srv := rpc.NewServer()
	if err := errors.Join(srv.Register(x.r), srv.Register(liteapp.NewBarriers())); err != nil {
		ln.Close()
		return nil, err
	}
	go liteapp.ServeRPC(srv, ln) // until close closes ln
	return x, nil
}

func (x *rpcExchange) set(slot int, dangling float64, ranks []float64) {
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	x.r.slots[slot] = Slot{Dangling: dangling, Ranks: append([]float64(nil), ranks...)}
}

func (x *rpcExchange) get(ctx context.Context, q, slot int, ranks []float64) (float64, error) {
	var s Slot
	err := x.call(ctx, q, "Ranks.Get", slot, &s)
	copy(ranks, s.Ranks)
	return s.Dangling, err
}

func (x *rpcExchange) barrier(ctx context.Context, name string, n int) error {
	return x.call(ctx, 0, "Barriers.Arrive", liteapp.Arrival{Name: name, N: n}, &struct{}{})
}

// call calls method at process q, dialling it on first use.
func (x *rpcExchange) call(ctx context.Context, q int, method string, args, reply any) error {
	x.mu.Lock()
	c := x.clients[q]
	if c == nil {
		var err error
		if c, err = rpc.Dial("tcp", x.addrs[q]); err != nil {
			x.mu.Unlock()
			return err
		}
		x.clients[q] = c
	}
	x.mu.Unlock()
	select {
	case call := <-c.Go(method, args, reply, nil).Done:
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (x *rpcExchange) close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, c := range x.clients {
		c.Close()
	}
	return x.ln.Close()
}
