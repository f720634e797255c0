package lite

import (
	"context"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// rpcRig is a two-node cluster with a caller on node 1 and a callee on
// node 2 serving RPC id 1, each on its own embedded API.
type rpcRig struct {
	c         *cluster.Cluster
	callerAPI krcore.API
	caller    *Node
	callee    *Node
	svc       *Service
}

// newRPCRig starts an rpcRig; everything in it is closed when t ends.
func newRPCRig(ctx context.Context, t *testing.T) *rpcRig {
	t.Helper()
	return newRPCRigOn(ctx, t, cluster.Config{Nodes: 2})
}

// newRPCRigOn is newRPCRig on a cluster of cfg (two nodes at least).
func newRPCRigOn(ctx context.Context, t *testing.T, cfg cluster.Config) *rpcRig {
	t.Helper()
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &rpcRig{c: c, callerAPI: core.Embed(c.Node(1))}
	if r.caller, err = Open(ctx, r.callerAPI, Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.caller.Close() })
	if r.callee, err = Open(ctx, core.Embed(c.Node(2)), Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.callee.Close() })
	if r.svc, err = r.callee.RegisterRPC(1); err != nil {
		t.Fatal(err)
	}
	return r
}
