//go:build !rdma

package smc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/smc"
)

// TestOpenRDMARefused: the kernel wire mode refuses a config without an
// EID or interface (ErrInvalid), an interface that does not exist, and,
// in a build without -tags rdma, any device (ibverbs.ErrNotBuilt).
func TestOpenRDMARefused(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]smc.RDMAConfig{
		"empty":        {},
		"no interface": {EID: "krcore-test"},
		"no EID":       {Interface: "lo"},
	} {
		if r, err := smc.OpenRDMA(ctx, cfg); !errors.Is(err, krcore.ErrInvalid) {
			t.Errorf("%s: OpenRDMA = %v, %v; want ErrInvalid", name, r, err)
		}
	}
	if r, err := smc.OpenRDMA(ctx, smc.RDMAConfig{EID: "krcore-test", Interface: "no-such-if0"}); err == nil {
		t.Errorf("an unknown interface: OpenRDMA = %v, want an error", r)
	}
	if r, err := smc.OpenRDMA(ctx, smc.RDMAConfig{EID: "krcore-test", Interface: "lo"}); !errors.Is(err, ibverbs.ErrNotBuilt) {
		t.Errorf("without -tags rdma: OpenRDMA = %v, %v; want ErrNotBuilt", r, err)
	}
}
