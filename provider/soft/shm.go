//go:build linux

package soft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krcore/krcore/offheap"
)

// How two nodes in different processes of one host find each other.
//
// A node that listens on TCP also listens on an abstract unix socket named
// after its fabric address ("@krcore-soft/" + address). Abstract names
// live in the network namespace, as TCP ports do, so a process that can
// reach the address over TCP on this host finds the socket under the same
// name; a node elsewhere has none here, and the connect fails at once. A
// node routing to a TCP address tries the socket first (in the background,
// the QP waiting as it does for a TCP dial): the dialer makes the segment
// (a memfd sealed to its size) and sends it with its hello (SCM_RIGHTS);
// each side checks that the other runs under the same user (SO_PEERCRED)
// in the same user namespace and boot of the kernel, and the acceptor keeps
// the link under the same one-link-per-node-pair rule as TCP's. Anything
// that fails (no socket, another user or namespace, a refused hello) makes
// routes to that address use TCP, silently; Node.PeerLink reports why.
// Config.TCPOnly, or KRCORE_SOFT_LINK=tcp in the environment, turns the
// shared-memory link off.

// EnvLink names the environment variable that, set to "tcp", makes every
// soft node in the process reach peers in other processes over TCP even
// when they run on this host (Config.TCPOnly for all nodes).
const EnvLink = "KRCORE_SOFT_LINK"

// shmRetry spaces out attempts to reach a peer by shared memory after one
// failed, while no TCP link to it is up either.
const shmRetry = time.Second

// shmHelloLen is the fixed size of a shared-memory hello.
const shmHelloLen = 8 + 2 + 1 + 36 + 16 + 8 + 2 + maxAddrLen

// Verdicts of a shared-memory hello's answer.
const (
	shmOK        = 0
	shmDuplicate = 1 // a link exists, or this side's own dial wins the race
	shmRefused   = 2
)

// shmDisabled reports whether the node keeps to TCP across processes.
func (n *Node) shmDisabled() bool {
	return n.cfg.TCPOnly || os.Getenv(EnvLink) == "tcp"
}

func shmSockName(addr string) string { return "@krcore-soft/" + addr }

// listenShm starts the node's shared-memory listener; a node that cannot
// have one (the name is taken) simply is reached over TCP.
func (n *Node) listenShm() {
	if n.ln == nil || n.shmDisabled() {
		return
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: shmSockName(n.addr), Net: "unix"})
	if err != nil {
		n.shmWhy = err
		return
	}
	n.shmLn = ln
	n.exports = newExports()
	n.wg.Add(1)
	go n.acceptEach(ln, func(c net.Conn) { n.serveShm(c.(*net.UnixConn)) })
}

// host identifies this kernel boot and user namespace.
var host = sync.OnceValue(func() (id [52]byte) {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	copy(id[:36], bytes.TrimSpace(b))
	if st, err := os.Stat("/proc/self/ns/user"); err == nil {
		if s, ok := st.Sys().(*syscall.Stat_t); ok {
			binary.BigEndian.PutUint64(id[36:], s.Dev)
			binary.BigEndian.PutUint64(id[44:], s.Ino)
		}
	}
	return id
})

// shmHello is what each side sends: magic, protocol version, verdict
// (answers only), boot id and user namespace, ring size, address.
func shmHello(verdict uint8, addr string) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, shmHelloLen), shmMagic)
	b = binary.BigEndian.AppendUint16(b, protocolVersion)
	b = append(b, verdict)
	id := host()
	b = append(b, id[:]...)
	b = binary.BigEndian.AppendUint64(b, shmRingSize)
	b = binary.BigEndian.AppendUint16(b, uint16(len(addr)))
	b = append(b, addr...)
	return b[:shmHelloLen]
}

// parseShmHello checks a hello from a peer and returns its verdict and
// address.
func parseShmHello(b []byte) (uint8, string, error) {
	if len(b) != shmHelloLen {
		return 0, "", fmt.Errorf("soft: shm hello of %d bytes", len(b))
	}
	if binary.BigEndian.Uint64(b) != shmMagic || binary.BigEndian.Uint16(b[8:]) != protocolVersion {
		return 0, "", errors.New("soft: shm hello: another protocol or version")
	}
	id := host()
	if !bytes.Equal(b[11:11+len(id)], id[:]) {
		return 0, "", errors.New("soft: shm peer runs in another boot or user namespace")
	}
	p := b[11+len(id):]
	if binary.BigEndian.Uint64(p) != shmRingSize {
		return 0, "", fmt.Errorf("soft: shm peer's rings are %d bytes, this node's %d", binary.BigEndian.Uint64(p), shmRingSize)
	}
	k := int(binary.BigEndian.Uint16(p[8:]))
	if k > maxAddrLen {
		return 0, "", fmt.Errorf("soft: shm hello address of %d bytes", k)
	}
	return b[10], string(p[10 : 10+k]), nil
}

// sameUser checks that the process at the other end of c runs as this one.
func sameUser(c *net.UnixConn) error {
	cred, err := peerCred(c)
	if err != nil {
		return err
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("soft: shm peer (pid %d) runs as uid %d, this process %d", cred.Pid, cred.Uid, os.Getuid())
	}
	return nil
}

// peerCred is the credentials of the process at the other end of c, as
// the kernel recorded them when it connected (SO_PEERCRED).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// readHello reads a hello, and the descriptors sent with it.
func readHello(c *net.UnixConn) ([]byte, []int, error) {
	b := make([]byte, shmHelloLen)
	oob := make([]byte, unix.CmsgSpace(4))
	k, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	var fds []int
	if oobn > 0 {
		if cm, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for i := range cm {
				if got, err := unix.ParseUnixRights(&cm[i]); err == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if err == nil && flags&unix.MSG_CTRUNC != 0 {
		err = errors.New("soft: shm hello carries too many descriptors")
	}
	if err == nil && k < len(b) {
		_, err = io.ReadFull(c, b[k:])
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	return b, fds, nil
}

// shmRoute returns the shared-memory link to addr and true; or nil and
// true while one is being set up (q is pumped when that ends); or false
// if routes to addr use TCP.
func (n *Node) shmRoute(addr string, q *qp) (link, bool) {
	if n.shmDisabled() {
		return nil, false
	}
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	l := n.shm[addr]
	if l != nil && l.up {
		return l, true
	}
	if l == nil {
		l = &shmLink{node: n, addr: addr}
		n.shm[addr] = l
	}
	if l.why != nil && !l.dialing {
		if t := n.tcp[addr]; t != nil && t.conn != nil || time.Since(l.lastFail) < shmRetry {
			return nil, false
		}
	}
	if q != nil && (len(l.waiters) == 0 || l.waiters[len(l.waiters)-1] != q) {
		l.waiters = append(l.waiters, q)
	}
	if !l.dialing && !n.closed.Load() {
		l.dialing = true
		n.wg.Add(1)
		go n.dialShm(l)
	}
	return nil, true
}

// dialShm tries to reach the link's peer over shared memory.
func (n *Node) dialShm(l *shmLink) {
	defer n.wg.Done()
	conn, seg, verdict, err := n.connectShm(l.addr)
	n.linkMu.Lock()
	l.dialing = false
	keep := err == nil && verdict == shmOK && !l.up && !n.closed.Load() && n.shm[l.addr] == l
	if err != nil {
		l.why, l.lastFail = err, time.Now()
	}
	if keep {
		l.attach(conn, seg, 0)
	}
	waiters := l.waiters
	if keep || err != nil {
		l.waiters = nil // a refused duplicate's waiters wait for the peer's dial
	}
	n.linkMu.Unlock()
	if !keep && conn != nil {
		conn.Close()
		seg.blk.Close()
	}
	for _, q := range waiters {
		q.pump()
	}
}

// connectShm connects to the node at addr by its unix socket, makes the
// segment and says hello.
func (n *Node) connectShm(addr string) (*net.UnixConn, *shmSeg, uint8, error) {
	d := net.Dialer{Timeout: n.cfg.DialTimeout}
	c, err := d.Dial("unix", shmSockName(addr))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("soft: no shared-memory link to %s: %w", addr, err)
	}
	conn := c.(*net.UnixConn)
	seg, verdict, err := n.greetShm(conn)
	if err != nil {
		conn.Close()
		return nil, nil, 0, fmt.Errorf("soft: shared-memory link to %s: %w", addr, err)
	}
	return conn, seg, verdict, nil
}

func (n *Node) greetShm(conn *net.UnixConn) (*shmSeg, uint8, error) {
	conn.SetDeadline(time.Now().Add(n.cfg.DialTimeout))
	defer conn.SetDeadline(time.Time{})
	if err := sameUser(conn); err != nil {
		return nil, 0, err
	}
	blk, err := offheap.AllocShared("krcore-soft-link", shmSegSize)
	if err != nil {
		return nil, 0, err
	}
	seg, _ := mapSeg(blk, true)
	if _, _, err := conn.WriteMsgUnix(shmHello(0, n.addr), unix.UnixRights(blk.FD()), nil); err != nil {
		blk.Close()
		return nil, 0, err
	}
	b, fds, err := readHello(conn)
	if err == nil && len(fds) > 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		err = errors.New("soft: shm answer carries descriptors")
	}
	var verdict uint8
	var reason string
	if err == nil {
		verdict, reason, err = parseShmHello(b)
	}
	if err == nil && verdict == shmRefused {
		err = fmt.Errorf("soft: shm peer refused: %s", reason)
	}
	if err != nil {
		blk.Close()
		return nil, 0, err
	}
	return seg, verdict, nil
}

// serveShm takes a hello on an accepted connection and keeps the link if
// it may.
func (n *Node) serveShm(conn *net.UnixConn) {
	conn.SetDeadline(time.Now().Add(n.cfg.DialTimeout))
	seg, peer, err := n.takeHello(conn)
	if err != nil {
		conn.WriteMsgUnix(shmHello(shmRefused, err.Error()[:min(len(err.Error()), maxAddrLen)]), nil, nil)
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	l, verdict, waiters := n.adoptShm(peer, conn, seg)
	for _, q := range waiters {
		q.pump()
	}
	if _, _, err := conn.WriteMsgUnix(shmHello(verdict, n.addr), nil, nil); err != nil && l != nil {
		l.kill()
	}
	if l == nil {
		conn.Close()
		seg.blk.Close()
	}
}

// takeHello reads and checks a dialer's hello and maps its segment.
func (n *Node) takeHello(conn *net.UnixConn) (*shmSeg, string, error) {
	if err := sameUser(conn); err != nil {
		return nil, "", err
	}
	b, fds, err := readHello(conn)
	if err != nil {
		return nil, "", err
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, "", fmt.Errorf("soft: shm hello carries %d descriptors, want 1", len(fds))
	}
	_, peer, err := parseShmHello(b)
	if err != nil {
		unix.Close(fds[0])
		return nil, "", err
	}
	blk, err := offheap.OpenSealed(fds[0], shmSegSize)
	if err != nil {
		unix.Close(fds[0])
		return nil, "", err
	}
	seg, err := mapSeg(blk, false)
	if err != nil {
		blk.Close()
		return nil, "", err
	}
	return seg, peer, nil
}

// adoptShm decides whether an incoming link from peer is kept: one link
// per node pair, and when both dial at once the lower address's dial wins.
// It returns the QPs that waited for the link, to be pumped.
func (n *Node) adoptShm(peer string, conn *net.UnixConn, seg *shmSeg) (*shmLink, uint8, []*qp) {
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	l := n.shm[peer]
	switch {
	case n.closed.Load():
		return nil, shmRefused, nil
	case l != nil && l.up:
		return nil, shmDuplicate, nil
	case l != nil && l.dialing && n.addr < peer:
		return nil, shmDuplicate, nil
	case l == nil:
		l = &shmLink{node: n, addr: peer}
		n.shm[peer] = l
	}
	l.attach(conn, seg, 1)
	waiters := l.waiters
	l.waiters = nil
	return l, shmOK, waiters
}

// attach brings the link up on conn and seg and starts its reader;
// node.linkMu is held and the node is open.
func (l *shmLink) attach(conn *net.UnixConn, seg *shmSeg, side int) {
	rc, _ := conn.SyscallConn()
	l.conn, l.rc, l.seg, l.side = conn, rc, seg, side
	l.bellFn = l.writeBell
	l.in, l.out = 1-side, side
	l.why = nil
	l.up = true
	l.watchPeer()
	l.node.placing[l] = struct{}{}
	seg.armAlive(side) // before the exports: a peer sees them only armed
	l.publishExports()
	l.node.wg.Add(1)
	go l.readLoop()
}

// closeShm closes the shared-memory links, for Close and BreakLinks.
func (n *Node) closeShm() {
	for _, l := range n.upShm() {
		l.kill()
	}
}

// upShm returns the node's shared-memory links that are up now.
func (n *Node) upShm() []*shmLink {
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	var links []*shmLink
	for _, l := range n.shm {
		if l.up {
			links = append(links, l)
		}
	}
	return links
}

// PeerLink reports how the node reaches the node at addr now: "mem" (the
// in-memory wire), "shm" (a shared-memory link), "tcp" or "" (no link up).
// why is why a shared-memory link to addr was not made, if one was tried.
func (n *Node) PeerLink(addr string) (kind string, why error) {
	if addr == n.addr || n.fab.lookup(addr) != nil {
		return "mem", nil
	}
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	if l := n.shm[addr]; l != nil {
		if l.up {
			return "shm", nil
		}
		why = l.why
	}
	if t := n.tcp[addr]; t != nil && t.conn != nil {
		return "tcp", why
	}
	return "", why
}
