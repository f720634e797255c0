package verbs

import "fmt"

// QPAttrMask names the attributes a QP state transition applies, after
// ibv_qp_attr_mask. Most are fields of QPAttr; AttrPort, AttrDestRdAtomic
// and AttrRdAtomic have no field because the provider chooses them (its
// port and P_Key index, its READ and atomic depths), but they are part of
// the step all the same, and an ibverbs provider must name them to the
// kernel.
type QPAttrMask uint32

// Attributes, with the ibv_qp_attr_mask bits they stand for.
const (
	AttrPort         QPAttrMask = 1 << iota // IBV_QP_PKEY_INDEX | IBV_QP_PORT (the provider's)
	AttrAccess                              // QPAttr.Access: IBV_QP_ACCESS_FLAGS
	AttrQKey                                // QPAttr.QKey: IBV_QP_QKEY
	AttrDest                                // QPAttr.Dest: IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
	AttrPathMTU                             // QPAttr.MTU: IBV_QP_PATH_MTU
	AttrDestRdAtomic                        // IBV_QP_MAX_DEST_RD_ATOMIC (the provider's)
	AttrMinRNRTimer                         // QPAttr.MinRNRTimer: IBV_QP_MIN_RNR_TIMER
	AttrSQPSN                               // QPAttr.SQPSN: IBV_QP_SQ_PSN
	AttrTimeout                             // QPAttr.Timeout: IBV_QP_TIMEOUT
	AttrRetryCount                          // QPAttr.RetryCount: IBV_QP_RETRY_CNT
	AttrRNRRetry                            // QPAttr.RNRRetry: IBV_QP_RNR_RETRY
	AttrRdAtomic                            // IBV_QP_MAX_QP_RD_ATOMIC (the provider's)
)

// Per-transport attribute sets of the steps that connect a QP, as the
// kernel's ib_modify_qp_is_ok requires them (and mlx5's DC rules for DCI
// and DCT).
const (
	initRC = AttrPort | AttrAccess
	initUD = AttrPort | AttrQKey
	rtrUC  = AttrDest | AttrPathMTU
	rtrRC  = rtrUC | AttrDestRdAtomic | AttrMinRNRTimer
	rtsRC  = AttrSQPSN | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrRdAtomic
	rtrDCT = AttrPathMTU | AttrMinRNRTimer
)

// transitions is the QP state machine: for each legal step, the
// attributes it applies per transport. A transport missing from a step
// may not take it. Every state may also go to RESET and to ERR (the
// verbs Modify QP rule; the kernel's own table lacks RESET -> ERR, which
// an ibverbs provider passes through INIT).
//
// Not listed, so refused: skipping a step; going back (RTS -> RTR); any
// step into SQE, which only the device takes (a UD or UC send error);
// SQD for DC transports; RTS for a DCT, which only receives. RTS -> RTS
// and the SQD and SQE steps back to RTS change nothing this package's
// QPAttr can express (the kernel allows only optional attributes there,
// and a QPAttr cannot say which fields are meant), so they apply nothing.
var transitions = map[[2]QPState]map[QPType]QPAttrMask{
	{StateReset, StateInit}: {RC: initRC, UC: initRC, UD: initUD, DCI: AttrPort, DCT: initRC},
	{StateInit, StateInit}:  {RC: initRC, UC: initRC, UD: initUD, DCI: AttrPort, DCT: initRC},
	{StateInit, StateRTR}:   {RC: rtrRC, UC: rtrUC, UD: 0, DCI: AttrPathMTU, DCT: rtrDCT},
	{StateRTR, StateRTS}:    {RC: rtsRC, UC: AttrSQPSN, UD: AttrSQPSN, DCI: rtsRC},
	{StateRTS, StateRTS}:    {RC: 0, UC: 0, UD: 0, DCI: 0},
	{StateRTS, StateSQD}:    {RC: 0, UC: 0, UD: 0},
	{StateSQD, StateSQD}:    {RC: 0, UC: 0, UD: 0},
	{StateSQD, StateRTS}:    {RC: 0, UC: 0, UD: 0},
	{StateSQE, StateRTS}:    {UC: 0, UD: 0},
}

// CheckTransition checks that a QP of transport t may go from state from
// to a.State and that a carries what the step needs, and returns the
// attributes the step applies: the provider reads those fields of a and
// no others. A step the state machine forbids fails with an error
// wrapping ErrQPState; an unknown transport or state, or a value out of
// range in an attribute the step applies, with one wrapping ErrInvalid.
// Both name the transition. Every provider's Modify calls it first, so
// the rules are the same on every RNIC.
func CheckTransition(t QPType, from QPState, a QPAttr) (QPAttrMask, error) {
	to := a.State
	fail := func(err error, why string) error {
		return fmt.Errorf("verbs: %s QP %s -> %s: %s: %w", t, from, to, why, err)
	}
	switch {
	case t < RC || t > DCT:
		return 0, fail(ErrInvalid, "unknown transport")
	case from > StateErr || to > StateErr:
		return 0, fail(ErrInvalid, "unknown state")
	case to == StateReset || to == StateErr:
		return 0, nil
	}
	mask, ok := transitions[[2]QPState{from, to}][t]
	if !ok {
		return 0, fail(ErrQPState, "transition not allowed")
	}
	if why := badAttr(mask, a); why != "" {
		return 0, fail(ErrInvalid, why)
	}
	return mask, nil
}

// badAttr says what is wrong with the attributes of a that mask applies,
// or "" when they are usable.
func badAttr(mask QPAttrMask, a QPAttr) string {
	d := a.Dest
	switch {
	case mask&AttrAccess != 0 && a.Access&^AccessAll != 0:
		return fmt.Sprintf("unknown access flags %#x", uint32(a.Access&^AccessAll))
	case mask&AttrDest != 0 && (d.QPN == 0 || d.Addr == "" && d.GID == GID{} && d.LID == 0):
		return "Dest needs the remote QP's number and its port's address, GID or LID"
	case mask&AttrPathMTU != 0 && a.MTU < 0:
		return fmt.Sprintf("negative MTU %d", a.MTU)
	case mask&AttrMinRNRTimer != 0 && a.MinRNRTimer < 0:
		return fmt.Sprintf("negative MinRNRTimer %v", a.MinRNRTimer)
	case mask&AttrTimeout != 0 && a.Timeout < 0:
		return fmt.Sprintf("negative Timeout %v", a.Timeout)
	case mask&AttrRetryCount != 0 && (a.RetryCount < 0 || a.RetryCount > 7):
		return fmt.Sprintf("RetryCount %d not in 0-7", a.RetryCount)
	case mask&AttrRNRRetry != 0 && (a.RNRRetry < 0 || a.RNRRetry > 7):
		return fmt.Sprintf("RNRRetry %d not in 0-7", a.RNRRetry)
	}
	return ""
}

// readyState is the state in which a QP of transport t does its work:
// RTS, or RTR for a transport the state machine takes no further (a DCT,
// which only receives).
func readyState(t QPType) QPState {
	if _, ok := transitions[[2]QPState{StateRTR, StateRTS}][t]; ok {
		return StateRTS
	}
	return StateRTR
}
