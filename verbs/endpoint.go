package verbs

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// GID is a 128-bit global identifier (an IPv6 address on RoCE).
type GID [16]byte

// String is the GID written as an IPv6 address.
func (g GID) String() string { return net.IP(g[:]).String() }

// ParseGID parses a GID in IPv6 text form.
func ParseGID(s string) (GID, error) {
	var g GID
	ip := net.ParseIP(s)
	if ip == nil {
		return g, fmt.Errorf("verbs: bad GID %q: %w", s, ErrInvalid)
	}
	copy(g[:], ip.To16())
	return g, nil
}

// Endpoint is what a peer needs to reach a QP: the port's address (GID and
// LID, or a fabric Addr), the QP number and the packet sequence number the
// QP starts from. Exchange it out of band (MarshalBinary or String).
type Endpoint struct {
	Addr string
	GID  GID
	LID  uint16
	QPN  uint32
	PSN  uint32
}

const endpointVersion = 1

// maxEndpointAddr bounds Addr so a marshalled endpoint stays small.
const maxEndpointAddr = 255

// ErrBadEndpoint reports an endpoint encoding that cannot be decoded.
var ErrBadEndpoint = errors.New("verbs: malformed endpoint")

// MarshalBinary encodes e: version, GID, LID, QPN, PSN, then Addr with a
// one-byte length, all big-endian.
func (e Endpoint) MarshalBinary() ([]byte, error) {
	if len(e.Addr) > maxEndpointAddr {
		return nil, fmt.Errorf("%w: address of %d bytes (max %d)", ErrBadEndpoint, len(e.Addr), maxEndpointAddr)
	}
	b := make([]byte, 0, 28+len(e.Addr))
	b = append(b, endpointVersion)
	b = append(b, e.GID[:]...)
	b = binary.BigEndian.AppendUint16(b, e.LID)
	b = binary.BigEndian.AppendUint32(b, e.QPN)
	b = binary.BigEndian.AppendUint32(b, e.PSN)
	b = append(b, byte(len(e.Addr)))
	return append(b, e.Addr...), nil
}

// UnmarshalBinary decodes what MarshalBinary produced.
func (e *Endpoint) UnmarshalBinary(b []byte) error {
	const fixed = 1 + 16 + 2 + 4 + 4 + 1
	if len(b) < fixed {
		return fmt.Errorf("%w: %d bytes, need at least %d", ErrBadEndpoint, len(b), fixed)
	}
	if b[0] != endpointVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrBadEndpoint, b[0], endpointVersion)
	}
	n := int(b[fixed-1])
	if len(b) != fixed+n {
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadEndpoint, len(b), fixed+n)
	}
	copy(e.GID[:], b[1:17])
	e.LID = binary.BigEndian.Uint16(b[17:])
	e.QPN = binary.BigEndian.Uint32(b[19:])
	e.PSN = binary.BigEndian.Uint32(b[23:])
	e.Addr = string(b[fixed:])
	return nil
}

// String is a text form ParseEndpoint reads back:
// "addr=HOST:PORT gid=HEX lid=N qpn=N psn=N".
func (e Endpoint) String() string {
	return fmt.Sprintf("addr=%s gid=%s lid=%d qpn=%d psn=%d", e.Addr, hex.EncodeToString(e.GID[:]), e.LID, e.QPN, e.PSN)
}

// ParseEndpoint parses the String form.
func ParseEndpoint(s string) (Endpoint, error) {
	var e Endpoint
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return e, fmt.Errorf("%w: field %q is not key=value", ErrBadEndpoint, f)
		}
		var err error
		switch k {
		case "addr":
			e.Addr = v
		case "gid":
			var raw []byte
			raw, err = hex.DecodeString(v)
			if err == nil && len(raw) != len(e.GID) {
				err = fmt.Errorf("%d bytes", len(raw))
			}
			copy(e.GID[:], raw)
		case "lid":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 16)
			e.LID = uint16(n)
		case "qpn", "psn":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 32)
			if k == "qpn" {
				e.QPN = uint32(n)
			} else {
				e.PSN = uint32(n)
			}
		default:
			err = errors.New("unknown key")
		}
		if err != nil {
			return e, fmt.Errorf("%w: %s: %v", ErrBadEndpoint, f, err)
		}
	}
	return e, nil
}
