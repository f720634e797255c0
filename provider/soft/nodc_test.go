package soft_test

import (
	"errors"
	"testing"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestNoDC: a node configured without DC reports it and refuses DC QPs
// the way the ibverbs provider does on rxe, while RC and UD still work.
func TestNoDC(t *testing.T) {
	dev, err := soft.NewFabric().NewNode(soft.Config{NoDC: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if dev.Attr().DCSupported {
		t.Fatal("DCSupported on a NoDC node")
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	for _, typ := range []verbs.QPType{verbs.DCI, verbs.DCT, verbs.RC, verbs.UD} {
		qp, err := pd.CreateQP(verbs.QPInit{Type: typ, SendCQ: cq, RecvCQ: cq})
		switch dc := typ == verbs.DCI || typ == verbs.DCT; {
		case dc && !errors.Is(err, verbs.ErrUnsupported):
			t.Errorf("CreateQP(%s): %v, want ErrUnsupported", typ, err)
		case !dc && err != nil:
			t.Errorf("CreateQP(%s): %v", typ, err)
		case !dc:
			qp.Close()
		}
	}
}
