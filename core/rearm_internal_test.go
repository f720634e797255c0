package core

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// psnLog records the send PSN every QP of a device is made ready with.
type psnLog struct {
	mu   sync.Mutex
	psns map[uint32][]uint32 // by QPN
}

func (l *psnLog) add(qpn, psn uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.psns[qpn] = append(l.psns[qpn], psn)
}

func (l *psnLog) of(qpn uint32) []uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint32(nil), l.psns[qpn]...)
}

// psnDevice is a device whose QPs report their RTS transitions to log.
type psnDevice struct {
	verbs.Device
	log *psnLog
}

func (d psnDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	return psnPD{pd, d.log}, err
}

type psnPD struct {
	verbs.PD
	log *psnLog
}

func (p psnPD) CreateQP(init verbs.QPInit) (verbs.QP, error) {
	qp, err := p.PD.CreateQP(init)
	return psnQP{qp, p.log}, err
}

type psnQP struct {
	verbs.QP
	log *psnLog
}

func (q psnQP) Modify(a verbs.QPAttr) error {
	err := q.QP.Modify(a)
	if err == nil && a.State == verbs.StateRTS {
		q.log.add(q.Num(), a.SQPSN)
	}
	return err
}

// TestRepairNewPSN: every time the runtime repairs a DCI (reset, ready
// again) it starts the send queue at a PSN the DCI has not used, as one
// would on hardware, so responses to its previous life cannot match.
func TestRepairNewPSN(t *testing.T) {
	n, err := soft.NewFabric().NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	log := &psnLog{psns: make(map[uint32][]uint32)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rt, err := New(ctx, Config{Device: psnDevice{n, log}, Node: 1, DCIs: 1, RCPeers: -1, Path: verbs.Path{Timeout: 50 * time.Millisecond, RetryCount: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	p := rt.dcis[0]
	for range 3 {
		rt.repair(p, nil)
	}
	psns := log.of(p.qp.Num())
	if len(psns) != 4 {
		t.Fatalf("DCI %d made ready %d times (%v), want 4", p.qp.Num(), len(psns), psns)
	}
	seen := map[uint32]bool{}
	for _, psn := range psns {
		if seen[psn] {
			t.Fatalf("DCI %d repaired at a PSN it had used: %v", p.qp.Num(), psns)
		}
		seen[psn] = true
	}
	if st := p.qp.State(); st != verbs.StateRTS {
		t.Fatalf("DCI after repair is %s", st)
	}
}
