//go:build !(linux && cgo && rdma)

package ibverbs

import (
	"context"
	"fmt"

	"github.com/krcore/krcore/verbs"
)

// ErrNotBuilt is what every entry point returns in a build without the rdma
// tag. It wraps verbs.ErrUnsupported, so callers can fall back to another
// provider with errors.Is(err, verbs.ErrUnsupported).
var ErrNotBuilt = fmt.Errorf("ibverbs: built without rdma support: rebuild with -tags rdma and libibverbs-dev: %w", verbs.ErrUnsupported)

// Devices fails with ErrNotBuilt: there is no libibverbs in this build.
func (*Provider) Devices() ([]string, error) { return nil, ErrNotBuilt }

// Open fails with ErrNotBuilt: there is no libibverbs in this build.
func (*Provider) Open(context.Context, string) (verbs.Device, error) {
	return nil, ErrNotBuilt
}

var _ verbs.Provider = (*Provider)(nil)
