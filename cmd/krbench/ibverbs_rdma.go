//go:build linux && cgo && rdma

package main

import (
	"context"

	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/verbs"
)

// ibverbsBuilt reports that this binary carries the libibverbs provider
// (built with -tags rdma).
const ibverbsBuilt = true

// openIBVerbs opens an RDMA device through libibverbs: name "" is the
// first device, port 0 is port 1, gidIdx < 0 lets the provider pick a GID
// (a RoCE v2 IPv4-mapped one if there is one).
func openIBVerbs(ctx context.Context, name string, port, gidIdx int) (verbs.Device, error) {
	p := &ibverbs.Provider{Port: port}
	if gidIdx >= 0 {
		p.FixedGID, p.GIDIndex = true, gidIdx
	}
	return p.Open(ctx, name)
}
