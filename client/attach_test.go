package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// TestAttachFirstAnswer: Attach reads HELLO's answer in its own goroutine
// (the client's reader starts after it), and every way that answer can
// fail to come ends Attach with the error that says why: the daemon's
// refusal, its bye, its closing the connection, or the context, ended or
// cancelled, while the daemon says nothing. Messages that answer no call
// are passed over. An attach that succeeds goes on with calls as usual.
func TestAttachFirstAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		daemon func(m *wire.Msg) []*wire.Msg // the answers to HELLO m; nil: close
		cancel bool                          // cancel the context instead of its deadline
		want   error                         // nil: attached
	}{
		{name: "answered", daemon: func(m *wire.Msg) []*wire.Msg {
			return []*wire.Msg{wire.NewMsg(wire.OpStats, m.Seq+7), helloReply(m)} // a stray answer first
		}},
		{name: "refused", daemon: func(m *wire.Msg) []*wire.Msg {
			return []*wire.Msg{m.Reply().Fail(verbs.ErrInvalid)}
		}, want: verbs.ErrInvalid},
		{name: "bye", daemon: func(*wire.Msg) []*wire.Msg {
			return []*wire.Msg{wire.NewMsg(wire.OpBye, 0).Str("shutting down")}
		}, want: krcore.ErrDaemonGone},
		{name: "closed", want: krcore.ErrDaemonGone},
		{name: "silent", daemon: func(*wire.Msg) []*wire.Msg { return []*wire.Msg{} }, want: context.DeadlineExceeded},
		{name: "silent, cancelled", daemon: func(*wire.Msg) []*wire.Msg { return []*wire.Msg{} }, cancel: true, want: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock, ln := fakeDaemon(t)
			served := make(chan struct{})
			go func() {
				defer close(served)
				conn, err := ln.AcceptUnix()
				if err != nil {
					return
				}
				defer conn.Close()
				m, err := wire.Recv(conn)
				if err != nil || tc.daemon == nil {
					return
				}
				for _, r := range tc.daemon(m) {
					wire.Send(conn, r)
				}
				// Then answer what comes (OpStatus) until the client goes.
				for {
					m, err := wire.Recv(conn)
					if err != nil {
						return
					}
					wire.Send(conn, m.Reply().Str("{}"))
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			actx := ctx
			if tc.want == context.DeadlineExceeded {
				var acancel context.CancelFunc
				actx, acancel = context.WithTimeout(ctx, 100*time.Millisecond)
				defer acancel()
			}
			if tc.cancel {
				var acancel context.CancelFunc
				actx, acancel = context.WithCancel(ctx)
				time.AfterFunc(100*time.Millisecond, acancel)
			}
			c, err := client.Attach(actx, client.Options{Socket: sock})
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Status(ctx); err != nil {
					t.Fatalf("a call after Attach: %v", err)
				}
				c.Close()
			} else if !errors.Is(err, tc.want) {
				t.Fatalf("Attach: %v, want %v", err, tc.want)
			}
			select {
			case <-served:
			case <-ctx.Done():
				t.Fatal("the connection stayed open after Attach failed or the client closed")
			}
		})
	}
}
