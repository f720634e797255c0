// Package cluster starts in-process krcore clusters: several soft RNIC nodes
// on one in-memory fabric, each with a KRCore runtime, sharing the MetaServer
// embedded in the first. Tests, examples and benchmarks use it; a real
// deployment runs one runtime per node (embedded or in krcored).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// ErrNodeExists: a node with that id is already running in the cluster.
var ErrNodeExists = errors.New("cluster: node id in use")

// Config shapes a cluster.
type Config struct {
	// Nodes is the number of nodes; ids are 1..Nodes.
	Nodes int
	// Runtime is the template for every node's runtime; Device, Node and
	// Meta are filled in.
	Runtime core.Config
	// Soft is the template for every soft RNIC; Name is filled in.
	Soft soft.Config
	// Fabric, if set, is used instead of a new in-memory fabric.
	Fabric *soft.Fabric
}

// Cluster is a running in-process cluster.
type Cluster struct {
	Fabric   *soft.Fabric
	Devices  []*soft.Node
	Runtimes []*core.Runtime
}

// Start brings up cfg.Nodes nodes, within ctx. Node 1 embeds the
// MetaServer.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Nodes <= 0 {
		return nil, fmt.Errorf("cluster: %d nodes: %w", cfg.Nodes, verbs.ErrInvalid)
	}
	c := &Cluster{Fabric: cfg.Fabric}
	if c.Fabric == nil {
		c.Fabric = soft.NewFabric()
	}
	if cfg.Soft.RetryTimeout == 0 {
		cfg.Soft.RetryTimeout = time.Second
	}
	for i := 1; i <= cfg.Nodes; i++ {
		if err := c.Add(ctx, cfg, krcore.NodeID(i)); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Add starts one more node with the given id, within ctx. An id already
// running is refused (ErrNodeExists): close that node first (see Remove).
func (c *Cluster) Add(ctx context.Context, cfg Config, id krcore.NodeID) error {
	if id == 0 {
		return fmt.Errorf("cluster: node id 0: %w", verbs.ErrInvalid)
	}
	if c.Node(id) != nil {
		return fmt.Errorf("cluster: add node %d: %w", id, ErrNodeExists)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cluster: add node %d: %w", id, err)
	}
	sc := cfg.Soft
	sc.Name = fmt.Sprintf("node%d-%p", id, c)
	dev, err := c.Fabric.NewNode(sc)
	if err != nil {
		return fmt.Errorf("cluster: node %d: %w", id, err)
	}
	rc := cfg.Runtime
	rc.Device, rc.Node = dev, id
	if len(c.Runtimes) > 0 {
		rc.Meta = append(rc.Meta[:0:0], c.Runtimes[0].MetaInfo())
	}
	rt, err := core.New(ctx, rc)
	if err == nil && ctx.Err() != nil {
		rt.Close()
		err = ctx.Err()
	}
	if err != nil {
		dev.Close()
		return fmt.Errorf("cluster: node %d: %w", id, err)
	}
	c.Devices = append(c.Devices, dev)
	c.Runtimes = append(c.Runtimes, rt)
	return nil
}

// Node returns the runtime of node id.
func (c *Cluster) Node(id krcore.NodeID) *core.Runtime {
	for _, rt := range c.Runtimes {
		if rt.Node() == id {
			return rt
		}
	}
	return nil
}

// Remove stops node id and takes it out of the cluster, as a crash would
// for its peers when kill is true (its NIC dies first: no deregistration),
// or cleanly (the runtime closes first) when it is false. It fails with
// verbs.ErrInvalid when no such node runs.
func (c *Cluster) Remove(id krcore.NodeID, kill bool) error {
	for i, rt := range c.Runtimes {
		if rt.Node() != id {
			continue
		}
		dev := c.Devices[i]
		if kill {
			dev.Close()
			rt.Close()
		} else {
			rt.Close()
			dev.Close()
		}
		c.Runtimes = append(c.Runtimes[:i:i], c.Runtimes[i+1:]...)
		c.Devices = append(c.Devices[:i:i], c.Devices[i+1:]...)
		return nil
	}
	return fmt.Errorf("cluster: remove node %d: not running: %w", id, verbs.ErrInvalid)
}

// Close stops every node, the MetaServer's last.
func (c *Cluster) Close() error {
	for i := len(c.Runtimes) - 1; i >= 0; i-- {
		c.Runtimes[i].Close()
		c.Devices[i].Close()
	}
	c.Runtimes, c.Devices = nil, nil
	return nil
}
