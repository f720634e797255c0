package main

import (
	"context"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/internal/liteapp"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// fabric is how every process of a run reaches the network: the RNIC it
// opens and the RC attributes of every QP, raw or the runtimes'.
type fabric struct {
	Device daemon.DeviceConfig `json:"device"`
	// AckTimeout is every RC QP's ACK timeout per retry; 0 means the
	// provider's (67 ms on ibverbs). An emulated VM under load stalls
	// longer than seven of the provider's.
	AckTimeout time.Duration `json:"ack_timeout,omitempty"`
}

// check says what is wrong with f.
func (f fabric) check() error {
	if p := f.Device.Provider; p != daemon.ProviderSoft && p != daemon.ProviderIBVerbs {
		return fmt.Errorf("-provider %q: soft or ibverbs", p)
	}
	if f.AckTimeout < 0 {
		return fmt.Errorf("-ack-timeout %v: negative", f.AckTimeout)
	}
	return nil
}

// path is the RC attributes every QP connects with.
func (f fabric) path() verbs.Path { return verbs.Path{Timeout: f.AckTimeout} }

// open opens this process's RNIC: a soft RNIC on loopback TCP, which
// other processes reach, or (-provider ibverbs, in a binary built with
// -tags rdma) a device context of its own on a real RNIC, as a verbs
// program opens one.
func (f fabric) open(ctx context.Context) (verbs.Device, error) {
	dc := f.Device
	switch dc.Provider {
	case daemon.ProviderSoft, "":
		return soft.NewNode(soft.Config{Listen: "127.0.0.1:0"})
	case daemon.ProviderIBVerbs:
		dev, err := ibverbs.Open(ctx, dc.IBDev, dc.IBPort, dc.GIDIdx)
		if err != nil {
			return nil, fmt.Errorf("open RDMA device %q: %w", dc.IBDev, err)
		}
		return dev, nil
	}
	return nil, fmt.Errorf("-provider %q: want soft or ibverbs: %w", dc.Provider, verbs.ErrInvalid)
}

// startNode starts a krcore node (RNIC and runtime) with id on the
// fabric, joining metas (none: it embeds the MetaServer).
func (f fabric) startNode(ctx context.Context, id krcore.NodeID, metas []meta.Info) (*liteapp.Node, error) {
	dev, err := f.open(ctx)
	if err != nil {
		return nil, err
	}
	return liteapp.StartNodeWith(ctx, core.Config{Device: dev, Node: id, Meta: metas, Path: f.path()})
}
