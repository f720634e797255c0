//go:build !(linux && cgo && rdma)

package ibverbs

import (
	"context"

	"github.com/krcore/krcore/verbs"
)

// Built reports whether this build carries the libibverbs binding: false
// here, in a build without -tags rdma (or without cgo, or not on Linux),
// which needs no C library.
const Built = false

// Devices fails with ErrNotBuilt: there is no libibverbs in this build.
func (*Provider) Devices() ([]string, error) { return nil, ErrNotBuilt }

// Open fails with ErrNotBuilt: there is no libibverbs in this build.
func (*Provider) Open(context.Context, string) (verbs.Device, error) {
	return nil, ErrNotBuilt
}

var _ verbs.Provider = (*Provider)(nil)
