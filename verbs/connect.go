package verbs

import (
	"fmt"
	"time"
)

// Path holds the connection attributes Connect and Ready apply. The zero
// value is usable: full remote access, port MTU, provider timeouts, seven
// retries and RNR retries.
type Path struct {
	// Access is the remote access the QP allows; 0 means AccessAll.
	Access Access
	// MTU is the path MTU; 0 means the port's.
	MTU int
	// Timeout is the ACK timeout per retry; 0 means the provider's.
	Timeout time.Duration
	// RetryCount and RNRRetry bound retries (0-7). Negative means 0;
	// 0 means 7; above 7 the RTS step fails with ErrInvalid.
	RetryCount int
	RNRRetry   int
	// MinRNRTimer is the receiver-not-ready back-off; 0 means the
	// provider's.
	MinRNRTimer time.Duration
	// QKey is a UD QP's queue key.
	QKey uint32
}

func (p Path) retries() (retry, rnr int) {
	pick := func(v int) int {
		switch {
		case v < 0:
			return 0
		case v == 0:
			return 7
		}
		return v
	}
	return pick(p.RetryCount), pick(p.RNRRetry)
}

func (p Path) access() Access {
	if p.Access == 0 {
		return AccessAll
	}
	return p.Access
}

// Connect moves an RC or UC QP from RESET through INIT and RTR to RTS,
// connected to the remote QP remote (its Endpoint, exchanged out of band).
func Connect(qp QP, remote Endpoint, p Path) error {
	retry, rnr := p.retries()
	steps := []QPAttr{
		{State: StateInit, Access: p.access()},
		{State: StateRTR, Dest: remote, MTU: p.MTU, MinRNRTimer: p.MinRNRTimer},
		{State: StateRTS, SQPSN: qp.Endpoint().PSN, Timeout: p.Timeout, RetryCount: retry, RNRRetry: rnr},
	}
	for _, a := range steps {
		if err := qp.Modify(a); err != nil {
			return fmt.Errorf("verbs: connect %s QP %d to %d: %w", qp.Type(), qp.Num(), remote.QPN, err)
		}
	}
	return nil
}

// Ready moves a UD QP or DCI to RTS, or a DCT to RTR: the states in which
// they send and receive without a connected peer.
func Ready(qp QP, p Path) error { return ReadyAt(qp, p, qp.Endpoint().PSN) }

// ReadyAt is Ready with the send queue starting at PSN psn. A QP reset and
// made ready again should start at a new PSN, as on hardware: responses to
// its previous life may still be on the wire, and a requester that matches
// them by PSN would take them for answers to its new requests.
func ReadyAt(qp QP, p Path, psn uint32) error {
	retry, rnr := p.retries()
	steps := []QPAttr{
		{State: StateInit, Access: p.access(), QKey: p.QKey},
		{State: StateRTR, MTU: p.MTU, MinRNRTimer: p.MinRNRTimer},
	}
	if readyState(qp.Type()) == StateRTS {
		steps = append(steps, QPAttr{State: StateRTS, SQPSN: psn, Timeout: p.Timeout, RetryCount: retry, RNRRetry: rnr})
	}
	for _, a := range steps {
		if err := qp.Modify(a); err != nil {
			return fmt.Errorf("verbs: ready %s QP %d: %w", qp.Type(), qp.Num(), err)
		}
	}
	return nil
}
