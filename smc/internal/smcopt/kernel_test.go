package smcopt

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/smc/internal/smcr"
)

// The tests named Kernel run only in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1):
// root, the kernel's smc module, a UEID, the veth topology (this side
// 10.1.0.1, the kernel client 10.1.0.2) and the ksmc tool
// (KRCORE_SMC_KSMC).
func vmOnly(t *testing.T) string {
	t.Helper()
	if os.Getenv("KRCORE_SMC_VM") != "1" {
		t.Skip("runs in .ci/smc-vm.sh's VM (KRCORE_SMC_VM=1)")
	}
	return os.Getenv("KRCORE_SMC_KSMC")
}

// kernelClient starts a kernel AF_SMC client (ksmc echo: n bytes echoed,
// then pings 8-byte round trips) toward 10.1.0.1:port; wait returns its
// output once it exits.
func kernelClient(ctx context.Context, t *testing.T, ksmc string, port, n, pings int) (wait func() (string, error)) {
	cmd := exec.CommandContext(ctx, ksmc, "echo", "10.1.0.1", fmt.Sprint(port), fmt.Sprint(n), fmt.Sprint(pings))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() (string, error) {
		err := cmd.Wait()
		t.Logf("kernel client:\n%s", out.String())
		return out.String(), err
	}
}

// accept takes one connection from l and checks that its SYN carried the
// SMC option, as every kernel AF_SMC client's does.
func accept(ctx context.Context, t *testing.T, l *net.TCPListener) *net.TCPConn {
	t.Helper()
	dl, _ := ctx.Deadline()
	l.SetDeadline(dl)
	c, err := l.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(dl)
	if ok, err := PeerAnnounced(c); err != nil || !ok {
		t.Fatalf("the kernel client's SYN: SMC option %v, %v; want true", ok, err)
	}
	return c
}

// echo sends first back, then echoes c until its peer closes.
func echo(t *testing.T, c *net.TCPConn, first []byte) {
	t.Helper()
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(c, c); err != nil {
		t.Fatalf("echo: %v", err)
	}
}

// TestKernelClientOptionOff: without the option in its SYN-ACK a kernel
// AF_SMC client falls back to TCP (PEERNOSMC) and sends its application's
// bytes first, never a CLC proposal.
func TestKernelClientOptionOff(t *testing.T) {
	ksmc := vmOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := Listen(ctx, "10.1.0.1:5202", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wait := kernelClient(ctx, t, ksmc, 5202, 64, 5)
	c := accept(ctx, t, l)
	defer c.Close()
	first := make([]byte, 8)
	if _, err := io.ReadFull(c, first); err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(first, smcr.EyecatcherR[:]) {
		t.Fatalf("the kernel client sent a CLC message (% x) to a listener without the option", first)
	}
	echo(t, c, first)
	out, err := wait()
	if err != nil || !strings.Contains(out, "mode=TCP fallback=0x03010000") {
		t.Fatalf("kernel client: %v; want a PEERNOSMC fallback", err)
	}
}

// TestKernelClientProposes: with the option in its SYN-ACK (Open, Listen) a
// kernel AF_SMC client sends an SMC-Rv2 CLC proposal; declined, it falls
// back to TCP with our diagnosis and its bytes follow on the connection.
func TestKernelClientProposes(t *testing.T) {
	ksmc := vmOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l, err := Listen(ctx, "10.1.0.1:5201", a)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wait := kernelClient(ctx, t, ksmc, 5201, 64, 5)
	c := accept(ctx, t, l)
	defer c.Close()
	p := readProposal(t, c)
	t.Logf("proposal: version %d, v1 %d, v2 %d, RoCE GID % x, EIDs %q, max conns %d links %d, release %d",
		p.Version, p.TypeV1, p.TypeV2, p.V2.RoCEGID, p.V2.EIDs, p.V2.MaxConns, p.V2.MaxLinks, p.V2.Release)
	d := &smcr.Decline{Version: 2, Diagnosis: smcr.DeclineNoSMCRDev, OSType: smcr.OSLinux, More: &[4]uint32{}}
	if _, err := c.Write(d.Append(nil)); err != nil {
		t.Fatal(err)
	}
	echo(t, c, nil)
	out, err := wait()
	if err != nil || !strings.Contains(out, "mode=TCP fallback=0x05000000 peer_diag=0x03030002") {
		t.Fatalf("kernel client: %v; want a fallback with PEERDECL and our NOSMCRDEV", err)
	}
}

// readProposal reads and decodes the kernel client's proposal and checks
// what .ci/smc-vm.sh's setup makes it offer: SMC-Rv2 from 10.1.0.2's
// RoCE GID with the shared UEID.
func readProposal(t *testing.T, c *net.TCPConn) *smcr.Proposal {
	t.Helper()
	b, err := smcr.ReadCLC(c)
	if err != nil {
		t.Fatalf("reading the kernel's proposal: %v (% x)", err, b)
	}
	p, err := smcr.DecodeProposal(b)
	if err != nil {
		t.Fatal(err)
	}
	wantGID := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 1, 14: 0, 15: 2}
	if p.V2 == nil || p.TypeV2 != smcr.SMCTypeR || p.V2.RoCEGID != wantGID ||
		len(p.V2.EIDs) != 1 || p.V2.EIDs[0] != smcr.MakeEID("KRCORE-SMC-CI") {
		t.Fatalf("proposal %+v, v2 %+v", p, p.V2)
	}
	return p
}

// TestKernelMarks: on loopback, between Go sockets, the option goes
// exactly where a socket was marked: a marked dialer's SYN and a marked
// listener's SYN-ACK carry it (PeerAnnounced, ServerAnnounced), unmarked
// ones do not, whatever the port (0: the kernel picks it).
func TestKernelMarks(t *testing.T) {
	vmOnly(t)
	a, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct{ listen, dial bool }{{true, true}, {true, false}, {false, true}, {false, false}} {
		var la, da *Announcer
		if tc.listen {
			la = a
		}
		l, err := Listen(ctx, "127.0.0.1:0", la)
		if err != nil {
			t.Fatal(err)
		}
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(false)
		if tc.dial {
			da, d.Control = a, a.Control
		}
		c, err := d.DialContext(ctx, "tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s := accept2(t, l)
		syn, err := PeerAnnounced(s)
		if err != nil || syn != tc.dial {
			t.Errorf("listen marked %v, dial marked %v: the SYN's option %v, %v", tc.listen, tc.dial, syn, err)
		}
		if da != nil {
			synack, err := da.ServerAnnounced(c.(*net.TCPConn))
			if err != nil || synack != tc.listen {
				t.Errorf("listen marked %v, dial marked %v: the SYN-ACK's option %v, %v", tc.listen, tc.dial, synack, err)
			}
		} else if _, err := a.ServerAnnounced(c.(*net.TCPConn)); err == nil {
			t.Errorf("ServerAnnounced on an unmarked socket: no error")
		}
		// The connection works past the option.
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(s, b); err != nil {
			t.Fatal(err)
		}
		c.Close()
		s.Close()
		l.Close()
	}
}

// accept2 accepts one connection within 5 s.
func accept2(t *testing.T, l *net.TCPListener) *net.TCPConn {
	t.Helper()
	l.SetDeadline(time.Now().Add(5 * time.Second))
	s, err := l.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
