package client_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// identityDiff lists how got answers errors.Is and errors.As differently
// from want: every sentinel that crosses the socket, every WC status, the
// completion error.
func identityDiff(want, got error) []string {
	var diff []string
	for _, s := range wire.Sentinels() {
		if errors.Is(want, s) != errors.Is(got, s) {
			diff = append(diff, fmt.Sprintf("errors.Is(%v) %v, embedded %v", s, errors.Is(got, s), errors.Is(want, s)))
		}
	}
	for st := verbs.Success; st <= verbs.GeneralErr; st++ {
		if errors.Is(want, st) != errors.Is(got, st) {
			diff = append(diff, fmt.Sprintf("errors.Is(%v) %v, embedded %v", st, errors.Is(got, st), errors.Is(want, st)))
		}
	}
	var wce, gce *verbs.CompletionError
	if errors.As(want, &wce) != errors.As(got, &gce) || wce != nil && wce.Status != gce.Status {
		diff = append(diff, fmt.Sprintf("completion error %v, embedded %v", gce, wce))
	}
	return diff
}

// TestConnectErrorCrosses makes Connect fail in the embedded runtime and
// through krcored on the same runtime, to a node no MetaServer knows and
// with the MetaServer down (and Region, to an unknown node and for an
// unknown name), and compares: the daemon's error answers
// errors.Is as the embedded one does for every sentinel and status, and its
// text is the embedded one's, which names the MetaServer READ and its status.
// A MetaServer that cannot be read leaves the node unreachable
// (ErrUnreachable), as an unknown node is.
func TestConnectErrorCrosses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rt := c.Node(2) // node 1 holds the MetaServer
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(rt, daemon.Config{Socket: sock, Logger: quiet, CallTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { srv.Close(); <-done }()
	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eq, err := rt.Queue()
	if err != nil {
		t.Fatal(err)
	}
	dq, err := cl.Queue()
	if err != nil {
		t.Fatal(err)
	}
	compare := func(what string, embedded, through error, want ...string) {
		t.Helper()
		t.Logf("%s: embedded: %v", what, embedded)
		t.Logf("%s: krcored:  %v", what, through)
		if embedded == nil || through == nil {
			t.Fatalf("%s: connect succeeded: embedded %v, krcored %v", what, embedded, through)
		}
		for _, d := range identityDiff(embedded, through) {
			t.Errorf("%s: %s", what, d)
		}
		// the READ's work request and QP differ from one try to the next
		digits := regexp.MustCompile("[0-9]+")
		if !strings.Contains(digits.ReplaceAllString(through.Error(), "N"), digits.ReplaceAllString(embedded.Error(), "N")) {
			t.Errorf("%s: krcored's error %q does not carry the embedded %q", what, through, embedded)
		}
		for _, w := range want {
			if !strings.Contains(through.Error(), w) {
				t.Errorf("%s: krcored's error %q does not say %q", what, through, w)
			}
		}
	}
	compare("connect to an unknown node", eq.Connect(ctx, 99, nil), dq.Connect(ctx, 99, nil), "node 99")
	_, embedded := rt.Region(ctx, 99, "table")
	_, through := cl.Region(ctx, 99, "table")
	compare("region of an unknown node", embedded, through, "node 99")
	_, embedded = rt.Region(ctx, 1, "nothing")
	_, through = cl.Region(ctx, 1, "nothing")
	compare("unknown region", embedded, through, "nothing")
	if !t.Failed() {
		// the MetaServer's node goes: its RNIC stops answering
		c.Devices[0].Close()
		embedded, through := eq.Connect(ctx, 3, nil), dq.Connect(ctx, 3, nil)
		compare("connect with the MetaServer down", embedded, through, "node 3", "READ of bucket", "RETRY_EXC_ERR")
		if !errors.Is(embedded, krcore.ErrUnreachable) {
			t.Errorf("connect with the MetaServer down: %v, want ErrUnreachable", embedded)
		}
	}
}
