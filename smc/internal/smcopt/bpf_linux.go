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
	offCbFlags       = 84
	offSk            = 184 // the socket, a pointer that may be nil
	offSkbTCPFlags   = 212
	helperCbFlagsSet = 59  // bpf_sock_ops_cb_flags_set
	helperSkStorage  = 107 // bpf_sk_storage_get
	helperLoadOpt    = 142 // bpf_load_hdr_opt
	helperStoreOpt   = 143 // bpf_store_hdr_opt
	helperReserveOpt = 144 // bpf_reserve_hdr_opt
	opPassiveEstab   = 5   // BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
	tcpFlagSYN       = 0x02
)

// A marked socket's value in the program's socket storage map.
const (
	marked       = 1 // the process marked it (Control): announce
	peerAnswered = 2 // and the SYN-ACK it got carried the option
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
	r0, r1, r2, r3, r4, r6, r7, r10 = 0, 1, 2, 3, 4, 6, 7, 10
)

func ldxdw(dst, src uint8, off int16) insn { return insn{code: 0x79, regs: dst | src<<4, off: off} }

// ldMapFD loads a map's address by its fd (two instruction slots).
func ldMapFD(dst uint8, fd int) []insn {
	return []insn{{code: 0x18, regs: dst | unix.BPF_PSEUDO_MAP_FD<<4, imm: int32(fd)}, {}}
}

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
func jne(dst uint8, imm int32, to string) insn {
	return insn{code: 0x55, regs: dst, imm: imm, target: to}
}
func ja(to string) insn            { return insn{code: 0x05, target: to} }
func call(helper int32) insn       { return insn{code: 0x85, imm: helper} }
func exit() insn                   { return insn{code: 0x95} }
func at(label string, i insn) insn { i.label = label; return i }

// program is the sock_ops program over the socket storage map mapFD:
// on listen(2) or connect(2) of a socket the process marked (Control), it
// asks for the header-option callbacks; for each SYN-ACK or SYN it
// reserves six bytes and writes Option; when a marked socket's connect
// completes it records whether the SYN-ACK carried Option; once any
// connection is established it turns the callbacks off again, so its
// other segments cost nothing.
func program(mapFD int) []insn {
	p := []insn{
		movx(r6, r1),
		ldxw(r2, r6, offOp),
		jeq(r2, unix.BPF_SOCK_OPS_TCP_LISTEN_CB, "start"),
		jeq(r2, unix.BPF_SOCK_OPS_TCP_CONNECT_CB, "start"),
		jeq(r2, unix.BPF_SOCK_OPS_HDR_OPT_LEN_CB, "reserve"),
		jeq(r2, unix.BPF_SOCK_OPS_WRITE_HDR_OPT_CB, "write"),
		jeq(r2, unix.BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, "active"),
		jeq(r2, opPassiveEstab, "quiet"),
		ja("out"),
	}
	// listen(2) or connect(2) of a marked socket: ask for the option
	// callbacks.
	p = append(p, storage("start", mapFD, "out")...)
	p = append(p,
		ldxw(r2, r6, offCbFlags),
		ork(r2, unix.BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG),
		ja("setflags"))
	// A marked socket's connect completed: did the SYN-ACK carry the
	// option? Searched as the helper takes an experimental option: kind,
	// length and the 4-byte ExID.
	p = append(p, storage("active", mapFD, "quiet")...)
	p = append(p, movx(r7, r0))
	p = append(p, withOption(helperLoadOpt)...)
	p = append(p,
		jne(r0, int32(len(Option)), "quiet"),
		stw(r7, 0, peerAnswered))
	p = append(p,
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
		jeq(r2, 0, "out"))
	p = append(p, withOption(helperStoreOpt)...)
	return append(p, at("out", movk(r0, 1)), exit())
}

// withOption calls helper (bpf_store_hdr_opt or bpf_load_hdr_opt) with
// the context, Option's bytes put on the stack, their length and no
// flags.
func withOption(helper int32) []insn {
	return []insn{
		stw(r10, -8, int32(binary.LittleEndian.Uint32(Option[0:4]))),
		sth(r10, -4, int32(binary.LittleEndian.Uint16(Option[4:6]))),
		movx(r1, r6),
		movx(r2, r10),
		addk(r2, -8),
		movk(r3, int32(len(Option))),
		movk(r4, 0),
		call(helper),
	}
}

// storage (at label) leaves in r0 the socket's value in the map, and
// jumps to miss if the socket has none (it is not marked) or no socket is
// at hand.
func storage(label string, mapFD int, miss string) []insn {
	p := []insn{at(label, ldxdw(r2, r6, offSk)), jeq(r2, 0, miss)}
	p = append(p, ldMapFD(r1, mapFD)...)
	return append(p, movk(r3, 0), movk(r4, 0), call(helperSkStorage), jeq(r0, 0, miss))
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

// An Announcer puts the SMC option into the SYNs and SYN-ACKs of the
// TCP sockets it marked (Control) in the processes of one cgroup (and its
// descendants), and tells whether a marked socket's SYN-ACK carried the
// option, until Close.
type Announcer struct {
	mu    sync.Mutex
	prog  int // -1 once closed
	link  int
	store int // the socket storage map: a marked socket's value
}

// Open loads the program and its socket map and attaches the program to
// the cgroup v2 directory cgroup ("" for the caller's own, see
// SelfCgroup). It needs CAP_BPF and CAP_NET_ADMIN; without them the error
// matches syscall.EPERM.
func Open(cgroup string) (*Announcer, error) {
	if cgroup == "" {
		var err error
		if cgroup, err = SelfCgroup(); err != nil {
			return nil, err
		}
	}
	store, err := socketMap()
	if err != nil {
		return nil, err
	}
	a := &Announcer{prog: -1, link: -1, store: store}
	if err := a.attach(cgroup); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *Announcer) attach(cgroup string) error {
	code, err := assemble(program(a.store))
	if err != nil {
		return err
	}
	if a.prog, err = loadProgram(code); err != nil {
		return err
	}
	dir, err := unix.Open(cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("smcopt: opening cgroup %s: %w", cgroup, err)
	}
	defer unix.Close(dir)
	la := linkCreateAttr{progFD: uint32(a.prog), targetFD: uint32(dir), attachType: unix.BPF_CGROUP_SOCK_OPS}
	if a.link, err = bpf(unix.BPF_LINK_CREATE, unsafe.Pointer(&la), unsafe.Sizeof(la)); err != nil {
		return fmt.Errorf("smcopt: attaching the sock_ops program to cgroup %s: %w", cgroup, err)
	}
	return nil
}

// Control marks the socket c, before its listen(2) or connect(2): its
// SYN-ACKs (a listener's) or its SYN (a dialer's) carry the option. It is
// a net.ListenConfig's or net.Dialer's Control.
func (a *Announcer) Control(network, address string, c syscall.RawConn) error {
	var err error
	cerr := c.Control(func(fd uintptr) { err = a.elem(unix.BPF_MAP_UPDATE_ELEM, int(fd), marked) })
	if err := errors.Join(cerr, err); err != nil {
		return fmt.Errorf("smcopt: marking a socket for the SMC option: %w", err)
	}
	return nil
}

// ServerAnnounced reports whether the SYN-ACK of c, dialed with Control,
// carried the option: whether the server speaks SMC.
func (a *Announcer) ServerAnnounced(c syscall.Conn) (bool, error) {
	var v uint32
	err := control(c, func(fd int) error {
		v = 0
		return a.elem(unix.BPF_MAP_LOOKUP_ELEM, fd, 0, &v)
	})
	if err != nil {
		return false, fmt.Errorf("smcopt: reading a socket's SMC mark (was it dialed with Control?): %w", err)
	}
	return v == peerAnswered, nil
}

// mapElemAttr is union bpf_attr's map element part.
type mapElemAttr struct {
	mapFD uint32
	_     uint32
	key   uint64
	value uint64
	flags uint64
}

// elem updates (to v) or looks up (into out) the map's value of the
// socket fd.
func (a *Announcer) elem(cmd uintptr, fd int, v uint32, out ...*uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.store < 0 {
		return fmt.Errorf("smcopt: announcer: %w", net.ErrClosed)
	}
	key := int32(fd)
	val := &v
	if len(out) > 0 {
		val = out[0]
	}
	attr := mapElemAttr{mapFD: uint32(a.store), key: uint64(uintptr(unsafe.Pointer(&key))),
		value: uint64(uintptr(unsafe.Pointer(val)))}
	_, err := bpf(cmd, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	return err
}

// mapCreateAttr is union bpf_attr's BPF_MAP_CREATE part, up to the BTF
// type ids.
type mapCreateAttr struct {
	mapType, keySize, valueSize, maxEntries, mapFlags, innerMapFD, numaNode uint32
	mapName                                                                 [16]byte
	mapIfindex, btfFD, btfKeyTypeID, btfValueTypeID                         uint32
}

// socketMap creates the socket storage map: a u32 per socket. The kernel
// requires BTF for its key and value: one type, a 32-bit int.
func socketMap() (int, error) {
	btf, err := loadBTF(btfInt())
	if err != nil {
		return -1, err
	}
	defer unix.Close(btf)
	a := mapCreateAttr{mapType: unix.BPF_MAP_TYPE_SK_STORAGE, keySize: 4, valueSize: 4,
		mapFlags: unix.BPF_F_NO_PREALLOC, btfFD: uint32(btf), btfKeyTypeID: 1, btfValueTypeID: 1}
	copy(a.mapName[:], "krcore_smc_mark")
	fd, err := bpf(unix.BPF_MAP_CREATE, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err != nil {
		return -1, fmt.Errorf("smcopt: creating the socket storage map: %w", err)
	}
	return fd, nil
}

// btfInt is a BTF blob (kernel/bpf/btf.c's format) of one type, id 1: a
// signed 32-bit int named "int".
func btfInt() []byte {
	le := binary.LittleEndian
	strs := []byte("\x00int\x00")
	var types []byte
	types = le.AppendUint32(types, 1)        // name: "int"
	types = le.AppendUint32(types, 1<<24)    // kind INT, no members
	types = le.AppendUint32(types, 4)        // 4 bytes
	types = le.AppendUint32(types, 1<<24|32) // signed, 32 bits at offset 0
	b := le.AppendUint16(nil, 0xeb9f)        // magic
	b = append(b, 1, 0)                      // version, flags
	b = le.AppendUint32(b, 24)               // header length
	b = le.AppendUint32(b, 0)                // types' offset
	b = le.AppendUint32(b, uint32(len(types)))
	b = le.AppendUint32(b, uint32(len(types))) // strings' offset
	b = le.AppendUint32(b, uint32(len(strs)))
	return append(append(b, types...), strs...)
}

// btfLoadAttr is union bpf_attr's BPF_BTF_LOAD part.
type btfLoadAttr struct {
	btf                        uint64
	logBuf                     uint64
	btfSize, logSize, logLevel uint32
}

func loadBTF(b []byte) (int, error) {
	log := make([]byte, 4096)
	a := btfLoadAttr{btf: uint64(uintptr(unsafe.Pointer(&b[0]))), btfSize: uint32(len(b)),
		logBuf: uint64(uintptr(unsafe.Pointer(&log[0]))), logSize: uint32(len(log)), logLevel: 1}
	fd, err := bpf(unix.BPF_BTF_LOAD, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err != nil {
		return -1, fmt.Errorf("smcopt: loading BTF for the socket map: %w (%s)", err,
			strings.TrimSpace(string(bytes.TrimRight(log, "\x00"))))
	}
	return fd, nil
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

// Close detaches the program and frees its map: sockets that start
// listening or connecting afterwards announce nothing (a listener
// already listening keeps the option's callbacks until it closes, and
// its SYN-ACKs then carry no option).
func (a *Announcer) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for _, fd := range []*int{&a.link, &a.prog, &a.store} {
		if *fd >= 0 {
			errs = append(errs, unix.Close(*fd))
			*fd = -1
		}
	}
	return errors.Join(errs...)
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
// the header option callbacks and a saved SYN), saving SYNs; with a
// non-nil a its SYN-ACKs carry the option.
func Listen(ctx context.Context, addr string, a *Announcer) (*net.TCPListener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	if a != nil {
		lc.Control = a.Control
	}
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
