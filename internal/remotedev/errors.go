package remotedev

import (
	"fmt"

	"github.com/krcore/krcore/internal/errid"
)

// wireError is an error in transit: its text and identity.
type wireError struct {
	Msg string
	ID  errid.Identity
}

// encodeError captures what errors.Is and errors.As can learn about err.
func encodeError(err error) *wireError {
	if err == nil {
		return nil
	}
	return &wireError{Msg: err.Error(), ID: errid.Capture(err)}
}

// decode rebuilds an error with the server's text that matches the same
// sentinels, Status and CompletionError as the server's (a *errid.Error).
// Unknown sentinel names (a newer server) are dropped: the text still says
// what happened.
func (w *wireError) decode() error {
	if w == nil {
		return nil
	}
	return w.ID.Err(w.Msg)
}

// callError adds which call failed, for logs that mix two processes.
func callError(o op, err error) error {
	return fmt.Errorf("remote %s: %w", o, err)
}
