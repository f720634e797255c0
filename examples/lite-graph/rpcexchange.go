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
// (liteapp.Barriers) after each. Worker p listens at peers.Addrs[p]. This
// file, with liteapp's Peers, Barriers and ServeRPC, is the whole of the
// engine's net/rpc code, the counterpart of liteExchange.
type rpcExchange struct {
	ln    net.Listener
	r     *Ranks
	peers liteapp.Peers
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
	x := &rpcExchange{ln: ln, r: &Ranks{}}
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
	err := x.peers.Call(ctx, q, "Ranks.Get", slot, &s)
	copy(ranks, s.Ranks)
	return s.Dangling, err
}

func (x *rpcExchange) barrier(ctx context.Context, name string, n int) error {
	return x.peers.Arrive(ctx, name, n)
}

func (x *rpcExchange) close() error {
	x.peers.Close()
	return x.ln.Close()
}
