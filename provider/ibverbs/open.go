package ibverbs

import (
	"context"
	"fmt"

	"github.com/krcore/krcore/verbs"
)

// ErrNotBuilt is what every entry point returns in a build without the rdma
// tag. It wraps verbs.ErrUnsupported, so callers can fall back to another
// provider with errors.Is(err, verbs.ErrUnsupported). It is defined in
// every build so that commands can name it without build tags of their own.
var ErrNotBuilt = fmt.Errorf("ibverbs: built without rdma support: rebuild with -tags rdma and libibverbs-dev: %w", verbs.ErrUnsupported)

// Open opens device name ("" the first libibverbs lists) on port (0 means
// 1) with the GID at table index gidIdx, or, when gidIdx < 0, the GID the
// provider picks (see GID selection). It is the -ib-dev/-ib-port/-gid-idx
// convention the commands share; in a build without the rdma tag it fails
// with ErrNotBuilt.
func Open(ctx context.Context, name string, port, gidIdx int) (verbs.Device, error) {
	p := &Provider{Port: port}
	if gidIdx >= 0 {
		p.FixedGID, p.GIDIndex = true, gidIdx
	}
	return p.Open(ctx, name)
}
