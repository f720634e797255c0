package verbs_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/krcore/krcore/verbs"
)

var (
	transports = []verbs.QPType{verbs.RC, verbs.UC, verbs.UD, verbs.DCI, verbs.DCT}
	states     = []verbs.QPState{verbs.StateReset, verbs.StateInit, verbs.StateRTR, verbs.StateRTS, verbs.StateSQD, verbs.StateSQE, verbs.StateErr}
)

// legalSteps lists, per transport, the steps ib_modify_qp_is_ok allows
// (mlx5's DC rules for DCI and DCT) besides going to RESET or ERR, which
// every state may.
var legalSteps = map[verbs.QPType][]string{
	verbs.RC:  {"RESET->INIT", "INIT->INIT", "INIT->RTR", "RTR->RTS", "RTS->RTS", "RTS->SQD", "SQD->SQD", "SQD->RTS"},
	verbs.UC:  {"RESET->INIT", "INIT->INIT", "INIT->RTR", "RTR->RTS", "RTS->RTS", "RTS->SQD", "SQD->SQD", "SQD->RTS", "SQE->RTS"},
	verbs.UD:  {"RESET->INIT", "INIT->INIT", "INIT->RTR", "RTR->RTS", "RTS->RTS", "RTS->SQD", "SQD->SQD", "SQD->RTS", "SQE->RTS"},
	verbs.DCI: {"RESET->INIT", "INIT->INIT", "INIT->RTR", "RTR->RTS", "RTS->RTS"},
	verbs.DCT: {"RESET->INIT", "INIT->INIT", "INIT->RTR"},
}

// fullAttr is a QPAttr to state to with every field set and in range.
func fullAttr(to verbs.QPState) verbs.QPAttr {
	return verbs.QPAttr{State: to, Access: verbs.AccessAll, QKey: 7,
		Dest: verbs.Endpoint{Addr: "h:1", QPN: 9, PSN: 3}, MTU: 1024, SQPSN: 5, RetryCount: 7, RNRRetry: 7}
}

// TestTransitionTable tries every pair of states on every transport.
func TestTransitionTable(t *testing.T) {
	for _, typ := range transports {
		for _, from := range states {
			for _, to := range states {
				step := from.String() + "->" + to.String()
				want := to == verbs.StateReset || to == verbs.StateErr || slices.Contains(legalSteps[typ], step)
				_, err := verbs.CheckTransition(typ, from, fullAttr(to))
				switch {
				case want && err != nil:
					t.Errorf("%s %s: %v, want allowed", typ, step, err)
				case !want && !errors.Is(err, verbs.ErrQPState):
					t.Errorf("%s %s: %v, want ErrQPState", typ, step, err)
				case !want && !strings.Contains(err.Error(), typ.String()+" QP "+from.String()+" -> "+to.String()):
					t.Errorf("%s %s: error %q does not name the transition", typ, step, err)
				}
			}
		}
	}
}

// TestTransitionAttrs: the attributes each connecting step applies are
// the kernel's required set (ib_modify_qp_is_ok's req_param; mlx5's for
// DCI and DCT), and a step with nothing to set applies nothing.
func TestTransitionAttrs(t *testing.T) {
	const (
		initRC = verbs.AttrPort | verbs.AttrAccess
		rtrUC  = verbs.AttrDest | verbs.AttrPathMTU
		rtsRC  = verbs.AttrSQPSN | verbs.AttrTimeout | verbs.AttrRetryCount | verbs.AttrRNRRetry | verbs.AttrRdAtomic
	)
	for _, c := range []struct {
		typ  verbs.QPType
		from verbs.QPState
		to   verbs.QPState
		want verbs.QPAttrMask
	}{
		{verbs.RC, verbs.StateReset, verbs.StateInit, initRC},
		{verbs.UC, verbs.StateReset, verbs.StateInit, initRC},
		{verbs.UD, verbs.StateReset, verbs.StateInit, verbs.AttrPort | verbs.AttrQKey},
		{verbs.DCI, verbs.StateReset, verbs.StateInit, verbs.AttrPort},
		{verbs.DCT, verbs.StateReset, verbs.StateInit, initRC},
		{verbs.RC, verbs.StateInit, verbs.StateInit, initRC},
		{verbs.RC, verbs.StateInit, verbs.StateRTR, rtrUC | verbs.AttrDestRdAtomic | verbs.AttrMinRNRTimer},
		{verbs.UC, verbs.StateInit, verbs.StateRTR, rtrUC},
		{verbs.UD, verbs.StateInit, verbs.StateRTR, 0},
		{verbs.DCI, verbs.StateInit, verbs.StateRTR, verbs.AttrPathMTU},
		{verbs.DCT, verbs.StateInit, verbs.StateRTR, verbs.AttrPathMTU | verbs.AttrMinRNRTimer},
		{verbs.RC, verbs.StateRTR, verbs.StateRTS, rtsRC},
		{verbs.DCI, verbs.StateRTR, verbs.StateRTS, rtsRC},
		{verbs.UC, verbs.StateRTR, verbs.StateRTS, verbs.AttrSQPSN},
		{verbs.UD, verbs.StateRTR, verbs.StateRTS, verbs.AttrSQPSN},
		{verbs.RC, verbs.StateRTS, verbs.StateRTS, 0},
		{verbs.UD, verbs.StateSQE, verbs.StateRTS, 0},
		{verbs.RC, verbs.StateRTS, verbs.StateErr, 0},
		{verbs.DCT, verbs.StateRTR, verbs.StateReset, 0},
	} {
		got, err := verbs.CheckTransition(c.typ, c.from, fullAttr(c.to))
		if err != nil || got != c.want {
			t.Errorf("%s %s -> %s: %#x, %v; want %#x", c.typ, c.from, c.to, got, err, c.want)
		}
	}
}

// TestTransitionBadAttrs: a value out of range in an attribute the step
// applies is ErrInvalid; the same value where the step does not read it
// is ignored, as a provider ignores it.
func TestTransitionBadAttrs(t *testing.T) {
	rtr := fullAttr(verbs.StateRTR)
	noDest, noAddr := rtr, rtr
	noDest.Dest.QPN = 0
	noAddr.Dest.Addr = ""
	badAccess := fullAttr(verbs.StateInit)
	badAccess.Access = 1 << 20
	rts := fullAttr(verbs.StateRTS)
	retry, rnr, timeout := rts, rts, rts
	retry.RetryCount, rnr.RNRRetry, timeout.Timeout = 8, -1, -1
	negMTU := rtr
	negMTU.MTU = -1
	for _, c := range []struct {
		name string
		typ  verbs.QPType
		from verbs.QPState
		a    verbs.QPAttr
		bad  bool
	}{
		{"RC without dest QPN", verbs.RC, verbs.StateInit, noDest, true},
		{"UC without dest address", verbs.UC, verbs.StateInit, noAddr, true},
		{"UD without dest", verbs.UD, verbs.StateInit, noDest, false},
		{"DCT without dest", verbs.DCT, verbs.StateInit, noDest, false},
		{"RC unknown access", verbs.RC, verbs.StateReset, badAccess, true},
		{"UD unknown access", verbs.UD, verbs.StateReset, badAccess, false},
		{"RC RetryCount 8", verbs.RC, verbs.StateRTR, retry, true},
		{"DCI RNRRetry -1", verbs.DCI, verbs.StateRTR, rnr, true},
		{"RC Timeout -1", verbs.RC, verbs.StateRTR, timeout, true},
		{"UD RetryCount 8", verbs.UD, verbs.StateRTR, retry, false},
		{"RC RTS->RTS RetryCount 8", verbs.RC, verbs.StateRTS, retry, false},
		{"UC MTU -1", verbs.UC, verbs.StateInit, negMTU, true},
	} {
		_, err := verbs.CheckTransition(c.typ, c.from, c.a)
		if c.bad != errors.Is(err, verbs.ErrInvalid) || !c.bad && err != nil {
			t.Errorf("%s: %v, want ErrInvalid %v", c.name, err, c.bad)
		}
	}
	for _, c := range []struct {
		typ      verbs.QPType
		from, to verbs.QPState
	}{{0, verbs.StateReset, verbs.StateInit}, {verbs.DCT + 1, verbs.StateReset, verbs.StateErr}, {verbs.RC, verbs.StateReset, 99}, {verbs.RC, 42, verbs.StateReset}} {
		if _, err := verbs.CheckTransition(c.typ, c.from, fullAttr(c.to)); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("%s %s -> %s: %v, want ErrInvalid", c.typ, c.from, c.to, err)
		}
	}
}
