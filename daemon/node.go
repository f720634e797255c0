//go:build linux

package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// Providers a DeviceConfig names.
const (
	ProviderSoft    = "soft"
	ProviderIBVerbs = "ibverbs"
)

// DeviceConfig names the RNIC krcored opens.
type DeviceConfig struct {
	// Provider is ProviderSoft (also when empty) or ProviderIBVerbs.
	Provider string
	// Listen is the soft RNIC's TCP address for other hosts; empty keeps
	// it in this process's memory.
	Listen string
	// IBDev, IBPort and GIDIdx choose the ibverbs device (empty: the
	// first), its port and the GID its endpoints carry (-1: a RoCE v2
	// IPv4-mapped GID if there is one), as ibverbs.Open takes them.
	IBDev  string
	IBPort int
	GIDIdx int
}

// NodeConfig is krcored on one node: the RNIC it opens, the runtime it
// starts there and the server it runs over the runtime.
type NodeConfig struct {
	// Config is the server's (New); its Logger is the runtime's too.
	Config
	// Node is this node's cluster-wide id (non-zero).
	Node krcore.NodeID
	// Meta lists the MetaServers the runtime joins; none embeds one.
	Meta []meta.Info
	// MetaBuckets and MetaSlots size the embedded MetaServer's table (see
	// core.Config); 0: meta's defaults.
	MetaBuckets, MetaSlots int
	// Membership, if set, is where the node registers (see
	// core.Config.Membership); the caller closes it after the Node.
	Membership meta.Membership
	// Device names the RNIC.
	Device DeviceConfig
}

// Node is krcored running on a node: the RNIC, the runtime on it and the
// server, which it owns and Close closes.
type Node struct {
	dev verbs.Device
	rt  *core.Runtime
	srv *Server
}

// Start brings up krcored: it opens the RNIC, starts the runtime on it (in
// RC-only mode on a device without DC, as every ibverbs device is) and
// binds the server's socket. ctx bounds the start only. What Start made is
// closed again if a later step fails.
func Start(ctx context.Context, nc NodeConfig) (*Node, error) {
	dev, err := nc.Device.open(ctx)
	if err != nil {
		return nil, err
	}
	rt, err := core.New(ctx, core.Config{Device: dev, Node: nc.Node, Meta: nc.Meta, Membership: nc.Membership,
		MetaBuckets: nc.MetaBuckets, MetaSlots: nc.MetaSlots, Logger: nc.Logger})
	if err != nil {
		dev.Close()
		return nil, err
	}
	srv, err := New(rt, nc.Config)
	if err != nil {
		rt.Close()
		dev.Close()
		return nil, err
	}
	return &Node{dev: dev, rt: rt, srv: srv}, nil
}

// open opens the RNIC c names: a soft node on a fabric of its own, or a
// device through libibverbs.
func (c DeviceConfig) open(ctx context.Context) (verbs.Device, error) {
	switch c.Provider {
	case ProviderIBVerbs:
		dev, err := ibverbs.Open(ctx, c.IBDev, c.IBPort, c.GIDIdx)
		if err != nil {
			return nil, fmt.Errorf("open RDMA device %q port %d: %w", c.IBDev, c.IBPort, err)
		}
		return dev, nil
	case ProviderSoft, "":
		dev, err := soft.NewFabric().NewNode(soft.Config{Listen: c.Listen})
		if err != nil {
			return nil, fmt.Errorf("start soft RNIC: %w", err)
		}
		return dev, nil
	}
	return nil, fmt.Errorf("daemon: provider %q: want %s or %s: %w", c.Provider, ProviderSoft, ProviderIBVerbs, verbs.ErrInvalid)
}

// Server is the node's socket server.
func (n *Node) Server() *Server { return n.srv }

// Runtime is the node's runtime.
func (n *Node) Runtime() *core.Runtime { return n.rt }

// Device is the node's RNIC.
func (n *Node) Device() verbs.Device { return n.dev }

// Serve serves clients until ctx ends or Close (Server.Serve).
func (n *Node) Serve(ctx context.Context) error { return n.srv.Serve(ctx) }

// Close closes the server (telling every client goodbye), then the runtime,
// then the RNIC. A server that Serve already closed, when its ctx ended, is
// no error.
func (n *Node) Close() error {
	err := n.srv.Close()
	if errors.Is(err, krcore.ErrClosed) {
		err = nil
	}
	return errors.Join(err, n.rt.Close(), n.dev.Close())
}
