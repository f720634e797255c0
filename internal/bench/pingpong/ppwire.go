package pingpong

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/krcore/krcore/verbs"
)

// The out-of-band exchange of rdma-core's ibv_rc_pingpong
// (libibverbs/examples/rc_pingpong.c), spoken byte for byte so that
// `krbench pingpong` and ibv_rc_pingpong connect to each other:
//
//  1. the client connects over TCP (port 18515 by default) and writes one
//     message of ppMsgLen bytes: "LLLL:QQQQQQ:PPPPPP:GGG...G" and a NUL,
//     the LID in 4 hex digits, the QP number and the first PSN in 6, and
//     the GID in 32 (its 16 bytes in network order, as 4 groups of 8
//     digits: each group is a big-endian 32-bit word, which is what
//     pingpong.c's gid_to_wire_gid produces on any host);
//  2. the server reads it, brings its QP to RTR and RTS towards the
//     client, and answers with its own message of the same shape;
//  3. the client reads that and writes "done" with its NUL (5 bytes); the
//     server reads it and both close the connection.
//
// Numbers are lower-case hex with leading zeros; a side without a GID (no
// -g) sends 32 zeros. The C reader parses with sscanf("%x:%x:%x:%s"), so it
// is lenient; this one is strict about the shape and says what is wrong.

// ppMsgLen is the size of one exchange message, the C side's
// sizeof "0000:000000:000000:00000000000000000000000000000000": 51
// characters and the terminating NUL. Both sides read and write exactly
// this many bytes.
const ppMsgLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

// ppDone is the client's closing word, sent with its NUL.
var ppDone = []byte("done\x00")

// ppDest is what one side of ibv_rc_pingpong tells the other: its port's
// LID, its QP number, the PSN its first send carries, and its GID (all
// zero when the side runs without -g).
type ppDest struct {
	LID uint16
	QPN uint32
	PSN uint32
	GID verbs.GID
}

// errPPMsg marks a malformed exchange message.
var errPPMsg = errors.New("malformed ibv_rc_pingpong address message")

// encodePPMsg renders d as the ppMsgLen bytes sent on the wire.
func encodePPMsg(d ppDest) ([]byte, error) {
	if d.QPN > 0xffffff || d.PSN > 0xffffff {
		return nil, fmt.Errorf("%w: QPN %#x or PSN %#x does not fit 24 bits", errPPMsg, d.QPN, d.PSN)
	}
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN, d.PSN, wireGID(d.GID))
	b := make([]byte, ppMsgLen)
	copy(b, s) // the last byte stays the NUL
	return b, nil
}

// wireGID is a GID in the exchange's 32-hex-digit form.
func wireGID(g verbs.GID) string { return hex.EncodeToString(g[:]) }

// parseWireGID reads the 32-hex-digit form back.
func parseWireGID(s string) (verbs.GID, error) {
	var g verbs.GID
	if len(s) != 2*len(g) {
		return g, fmt.Errorf("%w: GID %q has %d hex digits, want %d", errPPMsg, s, len(s), 2*len(g))
	}
	if _, err := hex.Decode(g[:], []byte(s)); err != nil {
		return g, fmt.Errorf("%w: GID %q is not hex: %v", errPPMsg, s, err)
	}
	return g, nil
}

// decodePPMsg parses one message as read from the wire: ppMsgLen bytes
// whose text ends at the first NUL.
func decodePPMsg(b []byte) (ppDest, error) {
	var d ppDest
	if len(b) != ppMsgLen {
		return d, fmt.Errorf("%w: %d bytes, want %d", errPPMsg, len(b), ppMsgLen)
	}
	text := b
	if i := bytes.IndexByte(b, 0); i >= 0 {
		text = b[:i]
		if len(bytes.Trim(b[i:], "\x00")) != 0 {
			return d, fmt.Errorf("%w: bytes after the terminating NUL", errPPMsg)
		}
	}
	if len(text) == 0 {
		return d, fmt.Errorf("%w: empty", errPPMsg)
	}
	fields := strings.Split(string(text), ":")
	if len(fields) != 4 {
		return d, fmt.Errorf("%w: %q has %d colon-separated fields, want LID:QPN:PSN:GID", errPPMsg, text, len(fields))
	}
	num := func(name, s string, digits int) (uint64, error) {
		if len(s) == 0 || len(s) > digits {
			return 0, fmt.Errorf("%w: %s %q: want 1 to %d hex digits", errPPMsg, name, s, digits)
		}
		n, err := strconv.ParseUint(s, 16, 32)
		if err != nil {
			return 0, fmt.Errorf("%w: %s %q is not hex", errPPMsg, name, s)
		}
		return n, nil
	}
	lid, err := num("LID", fields[0], 4)
	if err != nil {
		return d, err
	}
	qpn, err := num("QPN", fields[1], 6)
	if err != nil {
		return d, err
	}
	psn, err := num("PSN", fields[2], 6)
	if err != nil {
		return d, err
	}
	g, err := parseWireGID(fields[3])
	if err != nil {
		return d, err
	}
	return ppDest{LID: uint16(lid), QPN: uint32(qpn), PSN: uint32(psn), GID: g}, nil
}

// NtopGID prints a GID as inet_ntop(AF_INET6) does, which is how
// ibv_rc_pingpong shows addresses: an IPv4-mapped GID is "::ffff:a.b.c.d"
// (Go's net.IP would print the bare IPv4 address).
func NtopGID(g verbs.GID) string {
	ip := net.IP(g[:])
	if v4 := ip.To4(); v4 != nil && g != (verbs.GID{}) {
		return "::ffff:" + v4.String()
	}
	return ip.String()
}

// String is the address line ibv_rc_pingpong prints for a side.
func (d ppDest) String() string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, d.QPN, d.PSN, NtopGID(d.GID))
}
