package remotedev_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/remotedev"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
	"github.com/krcore/krcore/verbs/conformance"
)

// retryTimeout keeps the link-death tests short, on both nodes.
const retryTimeout = 200 * time.Millisecond

// killLinkControl is the Control request a soft child answers by closing
// its node: its peer then hears nothing more, as when a host dies.
const killLinkControl = "kill-link"

func init() {
	childServers["soft"] = func() (*remotedev.Server, func(), error) { return softChild(retryTimeout) }
	childServers["soft-default"] = func() (*remotedev.Server, func(), error) { return softChild(0) }
}

// softChild serves a TCP soft node whose requests wait retry for their
// responses (0: soft.DefaultRetryTimeout), and closes it on
// killLinkControl.
func softChild(retry time.Duration) (*remotedev.Server, func(), error) {
	n, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: retry})
	if err != nil {
		return nil, nil, err
	}
	control := func(_ context.Context, name string, _ []byte) ([]byte, error) {
		if name != killLinkControl {
			return nil, fmt.Errorf("soft child: control %q: %w", name, verbs.ErrUnsupported)
		}
		return nil, n.Close()
	}
	return &remotedev.Server{Device: n, Control: control}, func() { n.Close() }, nil
}

// localNode starts a TCP soft node in this process, closed at test end (a
// second Close after the suite's is harmless).
func localNode(t testing.TB) *soft.Node {
	t.Helper()
	n, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: retryTimeout})
	if err != nil {
		t.Fatalf("soft node: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// crossProcess is the Factory: device a is a soft node in this process,
// device b a soft node in a child process, proxied. The two nodes talk the
// soft RNIC's TCP protocol between the processes.
func crossProcess(t testing.TB) (verbs.Device, verbs.Device) {
	a := localNode(t)
	ch := startChild(t, "soft", remotedev.Options{})
	return a, ch.Client
}

// killLink closes b's node in its child process.
func killLink(_, b verbs.Device) error {
	c, ok := b.(*remotedev.Client)
	if !ok {
		return fmt.Errorf("kill link: device b is a %T, not a *remotedev.Client", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Control(ctx, killLinkControl, nil)
	return err
}

// holdResponses holds back the responses that reach device a, the soft
// node in this process.
func holdResponses(a verbs.Device) (func() int, func()) { return a.(*soft.Node).HoldResponses() }

// TestConformanceAcrossProcesses runs the conformance suite with device b
// in another process.
func TestConformanceAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-process conformance run skipped in -short mode")
	}
	conformance.Run(t, crossProcess, conformance.Options{RetryTimeout: retryTimeout, KillLink: killLink, HoldResponses: holdResponses})
}
