//go:build !(linux && cgo && rdma)

package main

import (
	"context"

	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/verbs"
)

// ibverbsBuilt reports that this binary has no libibverbs provider: it was
// built without -tags rdma (or without cgo, or not on Linux), so it needs
// no C library.
const ibverbsBuilt = false

// openIBVerbs fails with the provider's "built without rdma support"
// error.
func openIBVerbs(context.Context, string, int, int) (verbs.Device, error) {
	return nil, ibverbs.ErrNotBuilt
}
