//go:build !(linux && cgo && rdma)

package ibverbs

import (
	"context"
	"errors"
	"testing"

	"github.com/krcore/krcore/verbs"
)

// TestStub checks that a build without the rdma tag says so clearly and in
// a way callers can test for.
func TestStub(t *testing.T) {
	var p Provider
	if p.Name() != "ibverbs" {
		t.Errorf("Name %q", p.Name())
	}
	if _, err := p.Devices(); !errors.Is(err, verbs.ErrUnsupported) {
		t.Errorf("Devices: %v, want verbs.ErrUnsupported", err)
	}
	d, err := p.Open(context.Background(), "")
	if d != nil || !errors.Is(err, verbs.ErrUnsupported) {
		t.Errorf("Open: %v, %v; want nil and verbs.ErrUnsupported", d, err)
	}
	t.Log(err)
}
