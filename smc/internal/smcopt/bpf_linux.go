package smcopt

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets into struct bpf_sock_ops (include/uapi/linux/bpf.h), the
// program's context, and the helpers it calls; the uapi fixes both.
const (
	offOp            = 0
	offRemotePort    = 64 // network byte order, shifted into the high 16 bits (on little-endian)
	offLocalPort     = 68 // host byte order
	offCbFlags       = 84
	offSkbTCPFlags   = 212
	helperCbFlagsSet = 59  // bpf_sock_ops_cb_flags_set
	helperStoreOpt   = 143 // bpf_store_hdr_opt
	helperReserveOpt = 144 // bpf_reserve_hdr_opt
	opActiveEstab    = 4   // BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
	opPassiveEstab   = 5   // BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
	tcpFlagSYN       = 0x02
)

// insn is one eBPF instruction as bpf(2) takes it.
type insn struct {
	code   uint8
	regs   uint8 // dst in the low nibble, src in the high one
	off    int16
	imm    int32
	target string // a jump's label, resolved by assemble
	label  string // this instruction's label
}

const (
	r0, r1, r2, r3, r4, r6, r10 = 0, 1, 2, 3, 4, 6, 10
)

func ldxw(dst, src uint8, off int16) insn { return insn{code: 0x61, regs: dst | src<<4, off: off} }
func movx(dst, src uint8) insn            { return insn{code: 0xbf, regs: dst | src<<4} }
func movk(dst uint8, imm int32) insn      { return insn{code: 0xb7, regs: dst, imm: imm} }
func addk(dst uint8, imm int32) insn      { return insn{code: 0x07, regs: dst, imm: imm} }
func andk(dst uint8, imm int32) insn      { return insn{code: 0x57, regs: dst, imm: imm} }
func ork(dst uint8, imm int32) insn       { return insn{code: 0x47, regs: dst, imm: imm} }
func stw(dst uint8, off int16, imm int32) insn {
	return insn{code: 0x62, regs: dst, off: off, imm: imm}
}
func sth(dst uint8, off int16, imm int32) insn {
	return insn{code: 0x6a, regs: dst, off: off, imm: imm}
}
func jeq(dst uint8, imm int32, to string) insn {
	return insn{code: 0x15, regs: dst, imm: imm, target: to}
}

// jne32 compares the low 32 bits (BPF_JMP32): imm is not sign-extended
// against a register a 32-bit load zero-extended.
func jne32(dst uint8, imm int32, to string) insn {
	return insn{code: 0x56, regs: dst, imm: imm, target: to}
}
func ja(to string) insn            { return insn{code: 0x05, target: to} }
func call(helper int32) insn       { return insn{code: 0x85, imm: helper} }
func exit() insn                   { return insn{code: 0x95} }
func at(label string, i insn) insn { i.label = label; return i }

// program is the sock_ops program for listeners on local port port
// (dial false) or for connections to remote port port (dial true): on
// listen(2), or on connect(2), it asks for the header-option callbacks;
// for each SYN-ACK, or SYN, it reserves six bytes and writes Option; once
// the connection is established it turns the callbacks off again, so its
// other segments cost nothing.
func program(port uint16, dial bool) []insn {
	optLo := int32(binary.LittleEndian.Uint32(Option[0:4]))
	optHi := int32(binary.LittleEndian.Uint16(Option[4:6]))
	start, estab, off, want := int32(unix.BPF_SOCK_OPS_TCP_LISTEN_CB), int32(opPassiveEstab), int16(offLocalPort), int32(port)
	if dial {
		start, estab, off = unix.BPF_SOCK_OPS_TCP_CONNECT_CB, opActiveEstab, offRemotePort
		want = int32(uint32(port>>8|port<<8) << 16) // the kernel loads skc_dport << 16
	}
	return []insn{
		movx(r6, r1),
		ldxw(r2, r6, offOp),
		jeq(r2, start, "start"),
		jeq(r2, unix.BPF_SOCK_OPS_HDR_OPT_LEN_CB, "reserve"),
		jeq(r2, unix.BPF_SOCK_OPS_WRITE_HDR_OPT_CB, "write"),
		jeq(r2, estab, "quiet"),
		ja("out"),
		// listen(2) on our port, or connect(2) to it: ask for the option
		// callbacks.
		at("start", ldxw(r2, r6, off)),
		jne32(r2, want, "out"),
		ldxw(r2, r6, offCbFlags),
		ork(r2, unix.BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG),
		ja("setflags"),
		// Established (an accepted connection inherits the listener's
		// flags): drop them.
		at("quiet", ldxw(r2, r6, offCbFlags)),
		andk(r2, ^int32(unix.BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG)),
		at("setflags", movx(r1, r6)),
		call(helperCbFlagsSet),
		ja("out"),
		// Room for the option, in SYNs and SYN-ACKs only.
		at("reserve", ldxw(r2, r6, offSkbTCPFlags)),
		andk(r2, tcpFlagSYN),
		jeq(r2, 0, "out"),
		movx(r1, r6),
		movk(r2, int32(len(Option))),
		movk(r3, 0),
		call(helperReserveOpt),
		ja("out"),
		// The option's bytes, from the stack.
		at("write", ldxw(r2, r6, offSkbTCPFlags)),
		andk(r2, tcpFlagSYN),
		jeq(r2, 0, "out"),
		stw(r10, -8, optLo),
		sth(r10, -4, optHi),
		movx(r1, r6),
		movx(r2, r10),
		addk(r2, -8),
		movk(r3, int32(len(Option))),
		movk(r4, 0),
		call(helperStoreOpt),
		at("out", movk(r0, 1)),
		exit(),
	}
}

// assemble resolves the labels of p and returns its bytes.
func assemble(p []insn) ([]byte, error) {
	where := map[string]int{}
	for i, in := range p {
		if in.label != "" {
			where[in.label] = i
		}
	}
	var b []byte
	for i, in := range p {
		if in.target != "" {
			t, ok := where[in.target]
			if !ok {
				return nil, fmt.Errorf("smcopt: no label %q", in.target)
			}
			in.off = int16(t - i - 1)
		}
		b = append(b, in.code, in.regs)
		b = binary.LittleEndian.AppendUint16(b, uint16(in.off))
		b = binary.LittleEndian.AppendUint32(b, uint32(in.imm))
	}
	return b, nil
}

// progLoadAttr is union bpf_attr's BPF_PROG_LOAD part, up to
// expected_attach_type.
type progLoadAttr struct {
	progType           uint32
	insnCnt            uint32
	insns              uint64
	license            uint64
	logLevel           uint32
	logSize            uint32
	logBuf             uint64
	kernVersion        uint32
	progFlags          uint32
	progName           [16]byte
	progIfindex        uint32
	expectedAttachType uint32
}

// linkCreateAttr is union bpf_attr's BPF_LINK_CREATE part.
type linkCreateAttr struct {
	progFD     uint32
	targetFD   uint32
	attachType uint32
	flags      uint32
}

func bpf(cmd uintptr, attr unsafe.Pointer, size uintptr) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(attr), size)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// An Announcer puts the SMC option into the SYN-ACKs of the TCP
// listeners on one port of the processes in one cgroup (and its
// descendants), until Close.
type Announcer struct {
	mu   sync.Mutex
	prog int // -1 once closed
	link int
}

// Announce loads and attaches the program for listeners on port in the
// cgroup v2 directory cgroup ("" for the caller's own, see SelfCgroup).
// It must be called before the listener's listen(2): the program asks
// for the option callbacks as the socket starts listening. It needs
// CAP_BPF and CAP_NET_ADMIN; without them the error matches
// syscall.EPERM.
func Announce(cgroup string, port uint16) (*Announcer, error) {
	return attach(cgroup, port, false)
}

// AnnounceDial is Announce for the SYNs of TCP connections the processes
// in cgroup open to remote port port (any address): a kernel AF_SMC
// server sees an SMC client and waits for its proposal. Connections made
// before AnnounceDial are not affected.
func AnnounceDial(cgroup string, port uint16) (*Announcer, error) {
	return attach(cgroup, port, true)
}

func attach(cgroup string, port uint16, dial bool) (*Announcer, error) {
	if port == 0 {
		return nil, errors.New("smcopt: the SMC option needs a port to match")
	}
	if cgroup == "" {
		var err error
		if cgroup, err = SelfCgroup(); err != nil {
			return nil, err
		}
	}
	code, err := assemble(program(port, dial))
	if err != nil {
		return nil, err
	}
	prog, err := loadProgram(code)
	if err != nil {
		return nil, err
	}
	dir, err := unix.Open(cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(prog)
		return nil, fmt.Errorf("smcopt: opening cgroup %s: %w", cgroup, err)
	}
	defer unix.Close(dir)
	la := linkCreateAttr{progFD: uint32(prog), targetFD: uint32(dir), attachType: unix.BPF_CGROUP_SOCK_OPS}
	link, err := bpf(unix.BPF_LINK_CREATE, unsafe.Pointer(&la), unsafe.Sizeof(la))
	if err != nil {
		unix.Close(prog)
		return nil, fmt.Errorf("smcopt: attaching the sock_ops program to cgroup %s: %w", cgroup, err)
	}
	return &Announcer{prog: prog, link: link}, nil
}

func loadProgram(code []byte) (int, error) {
	license := []byte("GPL\x00") // bpf_sock_ops_cb_flags_set is GPL-only
	log := make([]byte, 64<<10)
	a := progLoadAttr{
		progType: unix.BPF_PROG_TYPE_SOCK_OPS, insnCnt: uint32(len(code) / 8),
		insns: uint64(uintptr(unsafe.Pointer(&code[0]))), license: uint64(uintptr(unsafe.Pointer(&license[0]))),
		logLevel: 1, logSize: uint32(len(log)), logBuf: uint64(uintptr(unsafe.Pointer(&log[0]))),
	}
	copy(a.progName[:], "krcore_smc_opt")
	fd, err := bpf(unix.BPF_PROG_LOAD, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err != nil {
		msg := string(bytes.TrimRight(log, "\x00"))
		return -1, fmt.Errorf("smcopt: loading the sock_ops program: %w (verifier: %s)", err, strings.TrimSpace(msg))
	}
	return fd, nil
}

// Close detaches the program: listeners that start listening afterwards
// announce nothing (one already listening keeps the option's callbacks
// until it closes, and its SYN-ACKs then carry no option).
func (a *Announcer) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.prog < 0 {
		return nil
	}
	err := errors.Join(unix.Close(a.link), unix.Close(a.prog))
	a.prog, a.link = -1, -1
	return err
}

// SelfCgroup returns the cgroup v2 directory of the calling process, from
// /proc/self/cgroup and the cgroup2 mount in /proc/self/mounts.
func SelfCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("smcopt: %w", err)
	}
	var rel string
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			rel = p
		}
	}
	if rel == "" {
		return "", errors.New("smcopt: the process is in no cgroup v2")
	}
	mounts, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("smcopt: %w", err)
	}
	defer mounts.Close()
	s := bufio.NewScanner(mounts)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) > 2 && f[2] == "cgroup2" {
			return filepath.Join(f[1], rel), nil
		}
	}
	return "", errors.New("smcopt: no cgroup2 file system is mounted")
}

// SaveSYN makes l keep each connection's SYN, for PeerAnnounced. Set it
// before the peers connect. l must be plain TCP, not Multipath TCP, which
// Go listens with by default where the kernel has it (Go 1.24; see
// Listen): an MPTCP socket has no saved SYN.
func SaveSYN(l *net.TCPListener) error {
	err := control(l, func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_SAVE_SYN, 1) })
	if err != nil {
		return fmt.Errorf("smcopt: TCP_SAVE_SYN on %v (an MPTCP listener has none): %w", l.Addr(), err)
	}
	return nil
}

// Listen listens on the TCP address addr with plain TCP (Multipath TCP
// off: the kernel's AF_SMC peers speak TCP, and only a TCP socket has
// the header option callbacks and a saved SYN), saving SYNs.
func Listen(ctx context.Context, addr string) (*net.TCPListener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("smcopt: %w", err)
	}
	tl := l.(*net.TCPListener)
	if err := SaveSYN(tl); err != nil {
		tl.Close()
		return nil, err
	}
	return tl, nil
}

// PeerAnnounced reports whether the SYN of c, accepted from a listener
// with SaveSYN, carried the SMC option. The kernel hands a saved SYN out
// once: a second call fails.
func PeerAnnounced(c *net.TCPConn) (bool, error) {
	var syn []byte
	err := control(c, func(fd int) error {
		buf := make([]byte, 512)
		n, err := getsockoptBytes(fd, unix.IPPROTO_TCP, unix.TCP_SAVED_SYN, buf)
		syn = buf[:n]
		return err
	})
	if err != nil {
		return false, fmt.Errorf("smcopt: reading the saved SYN: %w", err)
	}
	return HasOption(syn)
}

func getsockoptBytes(fd, level, opt int, buf []byte) (int, error) {
	n := uint32(len(buf))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return 0, errno
	}
	if n == 0 {
		return 0, errors.New("no saved SYN (was SaveSYN set on the listener before the connection?)")
	}
	return int(n), nil
}

func control(c syscall.Conn, f func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
