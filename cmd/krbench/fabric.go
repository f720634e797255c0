package main

import (
	"fmt"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// fabric makes the soft RNIC nodes a run uses. It is the only place krbench
// names the soft provider; everything else speaks verbs.
type fabric interface {
	// newNode starts a node for one side ("client", "server").
	newNode(side string) (verbs.Device, error)
	// placement describes where the two sides are, for table headers.
	placement() string
}

// tcpFabric nodes listen on a TCP address: peers in other processes or on
// other hosts reach them over the soft fabric's wire protocol.
type tcpFabric struct{ listen string }

func (f tcpFabric) newNode(side string) (verbs.Device, error) {
	n, err := soft.NewNode(soft.Config{Listen: f.listen})
	if err != nil {
		return nil, fmt.Errorf("start %s soft RNIC on %s: %w", side, f.listen, err)
	}
	return n, nil
}

func (tcpFabric) placement() string { return placementCross }

// memFabric nodes share one in-memory wire: both sides in this process.
type memFabric struct{ fab *soft.Fabric }

func newMemFabric() memFabric { return memFabric{fab: soft.NewFabric()} }

func (f memFabric) newNode(side string) (verbs.Device, error) {
	n, err := f.fab.NewNode(soft.Config{})
	if err != nil {
		return nil, fmt.Errorf("start %s in-memory soft RNIC: %w", side, err)
	}
	return n, nil
}

func (memFabric) placement() string { return placementInproc }

// Placements, as printed in table headers and used in check names.
const (
	placementCross  = "cross-process"
	placementInproc = "in-process"
)
