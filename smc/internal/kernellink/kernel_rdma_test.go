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
	"sync"
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

// TestKernelClientKilled: the kernel client process is killed mid-echo;
// Echo ends with ErrPeerClosed, and (guest.sh checks after the tests) the
// kernel keeps no socket and, once we closed, no link group.
func TestKernelClientKilled(t *testing.T) {
	out, link, cmd := kernelConnectCmd(t, 5206, 3, 1<<20, 1000000)
	defer t.Logf("kernel client:\n%s", out)
	defer link.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := link.Echo(ctx); done <- err }()
	for !strings.Contains(out.String(), "bulk bytes=") { // the bulk echo is over: pings run
		select {
		case err := <-done:
			t.Fatalf("Echo ended before the kill: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := <-done; !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Echo after the client's kill: %v, want ErrPeerClosed", err)
	}
}

// kernelConnect starts `ksmc echo` toward port and answers its proposal
// with an accept (first contact; id distinguishes our system ID, so each
// test gets its own link group). The returned func waits for the client
// and checks that its socket was in mode SMCR.
func kernelConnect(t *testing.T, port int, id byte, n, pings int) (func() error, *Link) {
	t.Helper()
	out, link, cmd := kernelConnectCmd(t, port, id, n, pings)
	return func() error { return waitSMCR(t, cmd, out) }, link
}

// syncBuffer is ksmc's output, written by exec's copying goroutine and
// read by the test as it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// kernelConnectCmd is kernelConnect returning the running client and its
// output instead of a wait.
func kernelConnectCmd(t *testing.T, port int, id byte, n, pings int) (*syncBuffer, *Link, *exec.Cmd) {
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
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
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
	cf := link.Peer
	t.Logf("kernel confirm: QPN %d PSN %#x rkey %#x RMB %#x size %d token %d GIDs %d; CONFIRM_LINK response %+v",
		cf.QPN, cf.PSN, cf.RMBRkey, cf.RMBAddr, cf.RMBESize, cf.AlertToken, len(cf.GIDs), link.PeerLink)
	return out, link, cmd
}

// waitSMCR waits for the client and checks that its socket was in mode
// SMCR.
func waitSMCR(t *testing.T, cmd *exec.Cmd, out *syncBuffer) error {
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
}

// TestKernelServerDial: a Go client (10.1.0.2, rxeB) with the SMC option
// in its SYN reaches a kernel AF_SMC echo server (ksmc serve, 10.1.0.1):
// proposal, accept, confirm, CONFIRM_LINK; the kernel's socket is in mode
// SMCR, and 1 MiB and 1,000 8-byte round trips come back byte-exact.
func TestKernelServerDial(t *testing.T) {
	if os.Getenv("KRCORE_SMC_VM") != "1" {
		t.Skip("runs in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	srv := exec.Command(os.Getenv("KRCORE_SMC_KSMC"), "serve", "-n", "1", "5205")
	var out bytes.Buffer
	srv.Stdout, srv.Stderr = &out, &out
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	defer func() {
		srv.Process.Kill() // a no-op once it exited
		<-done
		t.Logf("kernel server:\n%s", out.String())
	}()
	a, err := smcopt.AnnounceDial("", 5205)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 1, 0, 2)}}
	d.SetMultipathTCP(false)
	var c net.Conn
	for i := 0; ; i++ { // the server may still be starting
		if c, err = d.DialContext(ctx, "tcp", "10.1.0.1:5205"); err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dev, err := ibverbs.Open(ctx, "rxeB", 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ifc, err := net.InterfaceByName("vethB")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	link, err := Dial(ctx, c, smcr.MakeEID("KRCORE-SMC-CI"), Config{Device: dev, MAC: ifc.HardwareAddr,
		SystemID: [8]byte{'k', 'r', 'c', 'o', 'r', 'e', 1, 1}, Hostname: "krcore-go"})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	t.Logf("connect %.1f ms; kernel accept: QPN %d rkey %#x RMB %#x size %d token %d; CONFIRM_LINK request %+v",
		float64(time.Since(start).Microseconds())/1e3, link.Peer.QPN, link.Peer.RMBRkey, link.Peer.RMBAddr,
		link.Peer.RMBESize, link.Peer.AlertToken, link.PeerLink)
	bulk := make([]byte, 1<<20)
	for i := range bulk {
		bulk[i] = byte(i*131 + 7)
	}
	start = time.Now()
	for off := 0; off < len(bulk); off += 32 << 10 {
		back, err := link.RoundTrip(ctx, bulk[off:off+32<<10])
		if err != nil || !bytes.Equal(back, bulk[off:off+32<<10]) {
			t.Fatalf("bulk at %d: %v (bytes equal: %v)", off, err, bytes.Equal(back, bulk[off:off+32<<10]))
		}
	}
	t.Logf("bulk bytes=%d ms=%.1f (32 KiB round trips)", len(bulk), float64(time.Since(start).Microseconds())/1e3)
	ping := []byte("krcoping")
	for i := -10; i < 1000; i++ {
		if i == 0 {
			start = time.Now()
		}
		back, err := link.RoundTrip(ctx, ping)
		if err != nil || !bytes.Equal(back, ping) {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	t.Logf("pingpong n=1000 rtt_us=%.1f", float64(time.Since(start).Microseconds())/1000)
	if err := link.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
		done <- err // for the deferred wait
	case <-time.After(30 * time.Second):
		t.Fatal("the kernel server did not end after our close")
	}
	if err != nil || !strings.Contains(out.String(), "mode=SMCR") || !strings.Contains(out.String(), "serve done echoed=1056656") {
		t.Fatalf("kernel server %v; want mode SMCR and %d bytes echoed", err, len(bulk)+1010*8)
	}
}
