//go:build rdma

package kernellink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/smc/internal/smcopt"
	"github.com/krcore/krcore/smc/internal/smcr"
)

// The tests run only in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1): a kernel
// AF_SMC client (ksmc, 10.1.0.2, rxeB) connects to a Go listener with the
// SMC option (10.1.0.1, rxeA), which accepts its SMC-Rv2 proposal with a
// QP and buffer on rxeA.

// TestKernelClientLink: the kernel confirms our accept and CONFIRM_LINK,
// and its socket is in mode SMCR.
func TestKernelClientLink(t *testing.T) {
	out, link := kernelConnect(t, 5203, 1, 0, 0)
	defer link.Close()
	if err := out(); err != nil {
		t.Fatal(err)
	}
}

// TestKernelClientEcho: over the link, the kernel client's bytes come
// back byte-exact (ksmc checks them), in bulk and as 8-byte ping-pongs.
func TestKernelClientEcho(t *testing.T) {
	out, link := kernelConnect(t, 5204, 2, 1<<20, 1000)
	defer link.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	n, err := link.Echo(ctx)
	t.Logf("echoed %d bytes: %v", n, err)
	if err := out(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Echo: %v, want ErrPeerClosed after the client closed", err)
	}
}

// kernelConnect starts `ksmc echo` toward port and answers its proposal
// with an accept (first contact; id distinguishes our system ID, so each
// test gets its own link group). The returned func waits for the client
// and checks that its socket was in mode SMCR.
func kernelConnect(t *testing.T, port int, id byte, n, pings int) (func() error, *Link) {
	t.Helper()
	if os.Getenv("KRCORE_SMC_VM") != "1" {
		t.Skip("runs in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a, err := smcopt.Announce("", uint16(port))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l, err := smcopt.Listen(ctx, fmt.Sprintf("10.1.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := exec.Command(os.Getenv("KRCORE_SMC_KSMC"), "echo", "10.1.0.1", fmt.Sprint(port), fmt.Sprint(n), fmt.Sprint(pings))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill := func() { cmd.Process.Kill(); cmd.Wait(); t.Logf("kernel client:\n%s", out.String()) }
	l.SetDeadline(time.Now().Add(60 * time.Second))
	c, err := l.AcceptTCP()
	if err != nil {
		kill()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b, err := smcr.ReadCLC(c)
	p, perr := smcr.DecodeProposal(b)
	if err != nil || perr != nil {
		kill()
		t.Fatal(err, perr)
	}
	dev, err := ibverbs.Open(ctx, "rxeA", 1, -1)
	if err != nil {
		kill()
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	ifc, err := net.InterfaceByName("vethA")
	if err != nil {
		kill()
		t.Fatal(err)
	}
	link, err := Accept(ctx, c, p, Config{Device: dev, MAC: ifc.HardwareAddr,
		SystemID: [8]byte{'k', 'r', 'c', 'o', 'r', 'e', 0, id}, Hostname: "krcore-go"})
	if err != nil {
		kill()
		t.Fatal(err)
	}
	cf := link.Confirm
	t.Logf("kernel confirm: QPN %d PSN %#x rkey %#x RMB %#x size %d token %d GIDs %d; CONFIRM_LINK response %+v",
		cf.QPN, cf.PSN, cf.RMBRkey, cf.RMBAddr, cf.RMBESize, cf.AlertToken, len(cf.GIDs), link.PeerLink)
	return func() error {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(240 * time.Second):
			cmd.Process.Kill()
			err = <-done
		}
		t.Logf("kernel client:\n%s", out.String())
		if err != nil || !strings.Contains(out.String(), "mode=SMCR") {
			return fmt.Errorf("kernel client: %v; want its socket in mode SMCR", err)
		}
		return nil
	}, link
}
