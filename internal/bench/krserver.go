package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/verbs"
)

// The KRCore side of a session. The server runs one runtime on its soft
// RNIC, with the MetaServer embedded; each client test starts a runtime of
// its own under a fresh node id that joins it (so no runtime ever meets a
// stale record of an earlier one) and closes it when the test ends.
const (
	serverNode      krcore.NodeID = 1
	firstClientNode               = 2
	// regionName is the region the server exports for one-sided tests.
	regionName = "krbench"
	regionSize = 64 << 10
	// echoPort is the server's two-sided port; clientPort the client's.
	echoPort   uint32 = 7
	clientPort uint32 = 8
)

// runVQEcho is the Test of a control.OpRun that has the server echo messages on
// its VQ port (the raw SEND echo is Test "send").
const runVQEcho = "vq-echo"

// krServer is the server's runtime and what it offers clients.
type krServer struct {
	rt   *core.Runtime
	mem  krcore.MR // exported as regionName
	echo *vqrun.Echo
	dev  verbs.Device // the device it owns: only a kept runtime's (-keep-runtime)
	// nextClient is the node id the next client runtime takes.
	nextClient krcore.NodeID
}

// keepKrServer starts the runtime -keep-runtime keeps for every session,
// on a device of its own that outlives the sessions' devices.
func keepKrServer(ctx context.Context, cfg *config, fab fabric, log *slog.Logger) (*krServer, error) {
	if t, ok := fab.(tcpFabric); ok {
		// The sessions' soft nodes listen on -fabric-addr; this one takes
		// a port of its own on the same host.
		host, _, err := net.SplitHostPort(t.listen)
		if err != nil {
			return nil, fmt.Errorf("-fabric-addr %q: %w", t.listen, err)
		}
		fab = tcpFabric{listen: net.JoinHostPort(host, "0"), tcpOnly: t.tcpOnly}
	}
	dev, err := fab.newNode("kept runtime")
	if err != nil {
		return nil, err
	}
	k, err := startKrServer(ctx, dev, log, cfg.timeout, newVQPoll(cfg, fab.placement()))
	if err != nil {
		dev.Close()
		return nil, err
	}
	k.dev = dev
	return k, nil
}

// clientNode hands out the node id of a client runtime.
func (k *krServer) clientNode() krcore.NodeID {
	id := k.nextClient
	k.nextClient++
	return id
}

func startKrServer(ctx context.Context, dev verbs.Device, log *slog.Logger, timeout time.Duration, poll vqrun.Poll) (_ *krServer, err error) {
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rt, err := core.New(sctx, core.Config{Device: dev, Node: serverNode, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("start KRCore runtime: %w", err)
	}
	k := &krServer{rt: rt, nextClient: firstClientNode}
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	if k.mem, err = rt.RegMR(regionSize, verbs.AccessAll); err != nil {
		return nil, fmt.Errorf("runtime region: %w", err)
	}
	if err = rt.Export(regionName, k.mem, 0, regionSize, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		return nil, fmt.Errorf("export runtime region: %w", err)
	}
	if k.echo, err = vqrun.NewEcho(core.Embed(rt), echoPort, poll); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *krServer) close() error {
	var errs []error
	if k.echo != nil {
		errs = append(errs, k.echo.Close())
	}
	if k.mem != nil {
		errs = append(errs, k.rt.Deregister(k.mem))
	}
	if k.rt != nil {
		errs = append(errs, k.rt.Close())
	}
	if k.dev != nil {
		errs = append(errs, k.dev.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close KRCore runtime: %w", err)
	}
	return nil
}
