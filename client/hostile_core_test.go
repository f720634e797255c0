package client_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// TestHostileClientRecvArgs: through krcored, receive buffers whose Off
// or Len overflow are refused as in the embedded runtime, and the waiting
// Pops refuse an empty out at once instead of waiting out their context.
func TestHostileClientRecvArgs(t *testing.T) {
	e := startEnv(t)
	c := attach(t, e)
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Bind(7); err != nil {
		t.Fatal(err)
	}
	inbox, _ := c.RegMR(256, verbs.AccessLocalWrite)
	for name, l := range map[string]krcore.Local{
		"off MaxInt":       inbox.Range(math.MaxInt, 1),
		"len MaxInt":       inbox.Range(1, math.MaxInt),
		"off+len overflow": inbox.Range(math.MaxInt-2, 8),
	} {
		if err := q.PushRecv(l); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("PushRecv(%s): %v, want ErrInvalid", name, err)
		}
	}
	for name, f := range map[string]func(ctx context.Context) error{
		"PopWait":     func(ctx context.Context) error { _, err := q.PopWait(ctx, nil); return err },
		"PopMsgsWait": func(ctx context.Context) error { _, err := q.PopMsgsWait(ctx, nil); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		err := f(ctx)
		cancel()
		if !errors.Is(err, verbs.ErrInvalid) || time.Since(start) > time.Second {
			t.Errorf("%s with no room: %v after %v, want ErrInvalid at once", name, err, time.Since(start))
		}
	}
}
