//go:build linux

package daemon

import (
	"errors"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// TestAudienceWire: an OpExport's optional audience is read whole, or
// refused: none, one principal, a count past MaxAudience (ErrLimit) and a
// count the body does not hold (ErrInvalid).
func TestAudienceWire(t *testing.T) {
	export := func() *wire.Msg {
		return wire.NewMsg(wire.OpExport, 0).Str("x").U64(1).U64(0).U64(8).U32(uint32(verbs.AccessRemoteRead))
	}
	parse := func(m *wire.Msg) ([]krcore.Principal, error) {
		p, err := wire.Parse(m.Bytes(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p.GetStr()
		p.GetU64()
		p.GetU64()
		p.GetU64()
		p.GetU32()
		return audience(p)
	}
	if to, err := parse(export()); err != nil || to != nil {
		t.Errorf("no audience: %v %v", to, err)
	}
	if to, err := parse(export().U32(1).U64(2).U32(9)); err != nil || len(to) != 1 || to[0] != (krcore.Principal{Node: 2, Port: 9}) {
		t.Errorf("one principal: %v %v", to, err)
	}
	if _, err := parse(export().U32(krcore.MaxAudience + 1)); !errors.Is(err, verbs.ErrLimit) {
		t.Errorf("%d principals: %v, want ErrLimit", krcore.MaxAudience+1, err)
	}
	if _, err := parse(export().U32(3).U64(2).U32(9)); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("3 principals announced, 1 sent: %v, want ErrInvalid", err)
	}
}
