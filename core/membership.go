package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/krcore/krcore/meta"
)

// mirrorWait bounds how long New waits for its record to reach its first
// MetaServer's table through the Membership.
const mirrorWait = 5 * time.Second

// listedServers appends to infos the other MetaServers cfg.Membership
// lists. A store out of reach lists none: the runtime reads from its own.
func (rt *Runtime) listedServers(ctx context.Context, infos []meta.Info) []meta.Info {
	if rt.cfg.Membership == nil {
		return infos
	}
	listed, err := rt.cfg.Membership.Servers(ctx)
	if err != nil {
		rt.log.Warn("krcore: listing MetaServers", "store", rt.cfg.Membership.String(), "err", err)
	}
	for _, i := range listed {
		if !slices.Contains(infos, i) {
			infos = append(infos, i)
		}
	}
	return infos
}

// register publishes the node's record: with the MetaServers, or in the
// Membership, and then waits until the first MetaServer's table holds it,
// so that a peer told of this node by New's return finds it.
func (rt *Runtime) register(ctx context.Context, rec meta.Record) error {
	if rt.cfg.Membership == nil {
		return rt.meta.Register(ctx, rec, rt.cfg.Lease)
	}
	l, err := rt.cfg.Membership.Register(ctx, rec, rt.cfg.Lease)
	if err != nil {
		return err
	}
	rt.lease = l
	wctx, cancel := context.WithTimeout(ctx, mirrorWait)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := rt.meta.Fetch(wctx, uint64(rec.Node))
		if err == nil {
			return nil
		}
		// A join storm can time out a MetaServer READ (its RC reader's
		// handshake, a torn bucket): only the wait's end, or an answer
		// that cannot change, gives up.
		if wctx.Err() == nil && !fetchFinal(err) {
			select {
			case <-tick.C:
				continue
			case <-wctx.Done():
			}
		}
		rt.deregister(ctx)
		rt.lease = nil
		return fmt.Errorf("core: node %d registered in %s but not served by the MetaServers within %v (do they mirror it?): %w",
			rec.Node, rt.cfg.Membership, mirrorWait, err)
	}
}

// fetchFinal reports whether a MetaServer lookup's error would not change
// on a retry.
func fetchFinal(err error) bool {
	return errors.Is(err, meta.ErrClosed) || errors.Is(err, meta.ErrBadRecord)
}

// deregister withdraws the node's record, where register put it.
func (rt *Runtime) deregister(ctx context.Context) {
	switch {
	case rt.lease != nil:
		rt.lease.Close(ctx)
	case rt.meta != nil:
		rt.meta.Deregister(ctx, uint64(rt.node))
	}
}

// MetaSource says where the records of the runtime's MetaServers come
// from: "embedded" (the MetaServers keep them) or the Membership (e.g.
// "etcd 10.0.0.1:2379 /krcore/").
func (rt *Runtime) MetaSource() string {
	if rt.cfg.Membership != nil {
		return rt.cfg.Membership.String()
	}
	return "embedded"
}

// MetaServers lists the MetaServers the runtime reads from, in the order
// it tries them.
func (rt *Runtime) MetaServers() []meta.Info { return slices.Clone(rt.metas) }
