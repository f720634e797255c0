package verbs

import "errors"

// Sentinel errors for calls that fail before reaching the wire. Test them
// with errors.Is; wrapped errors name the object and the limit involved.
var (
	// ErrClosed: the device or object was closed.
	ErrClosed = errors.New("verbs: closed")
	// ErrInvalid: an argument is malformed (nil CQ, zero size, bad opcode).
	ErrInvalid = errors.New("verbs: invalid argument")
	// ErrLimit: a request exceeds a device or queue limit.
	ErrLimit = errors.New("verbs: exceeds limit")
	// ErrQPState: the QP's state does not allow the call.
	ErrQPState = errors.New("verbs: wrong QP state")
	// ErrQueueFull: the send or receive queue has no room.
	ErrQueueFull = errors.New("verbs: queue full")
	// ErrCQOverrun: completions arrived while the CQ was full; the CQ and
	// its QPs are in error.
	ErrCQOverrun = errors.New("verbs: completion queue overrun")
	// ErrBusy: the object is still used by others (a PD with MRs, a CQ
	// with QPs).
	ErrBusy = errors.New("verbs: resource busy")
	// ErrUnsupported: the provider or device lacks the feature.
	ErrUnsupported = errors.New("verbs: not supported")
	// ErrNoDevice: no device with that name.
	ErrNoDevice = errors.New("verbs: no such device")
	// ErrUnreachable: the fabric address cannot be reached.
	ErrUnreachable = errors.New("verbs: address unreachable")
)
