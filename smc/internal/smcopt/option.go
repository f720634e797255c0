package smcopt

import (
	"errors"
	"fmt"
)

// Option is the SMC TCP option's six bytes as they appear in a TCP header.
var Option = [6]byte{254, 6, 0xe2, 0xd4, 0xc3, 0xd9}

// ErrNotTCP is returned for a saved SYN that is not an IPv4 or IPv6 TCP
// header.
var ErrNotTCP = errors.New("smcopt: saved SYN is not a TCP segment")

// HasOption reports whether the IP packet headers syn (IPv4 or IPv6, then
// TCP, as TCP_SAVED_SYN returns them) carry the SMC option.
func HasOption(syn []byte) (bool, error) {
	tcp, err := tcpHeader(syn)
	if err != nil {
		return false, err
	}
	opts := tcp[20:]
	for len(opts) > 0 {
		switch kind := opts[0]; kind {
		case 0: // end of options
			return false, nil
		case 1: // no-op
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || opts[1] < 2 || int(opts[1]) > len(opts) {
			return false, fmt.Errorf("%w: option %d overruns the header", ErrNotTCP, opts[0])
		}
		if opts[1] == 6 && [6]byte(opts) == Option {
			return true, nil
		}
		opts = opts[opts[1]:]
	}
	return false, nil
}

// tcpHeader returns the TCP header (with its options) in the IP packet
// headers b.
func tcpHeader(b []byte) ([]byte, error) {
	if len(b) < 1 {
		return nil, ErrNotTCP
	}
	var ipLen int
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 || b[9] != 6 {
			return nil, ErrNotTCP
		}
		ipLen = int(b[0]&15) * 4
	case 6:
		if len(b) < 40 || b[6] != 6 { // no extension headers before TCP
			return nil, ErrNotTCP
		}
		ipLen = 40
	default:
		return nil, ErrNotTCP
	}
	if len(b) < ipLen+20 {
		return nil, ErrNotTCP
	}
	t := b[ipLen:]
	off := int(t[12]>>4) * 4
	if off < 20 || off > len(t) {
		return nil, fmt.Errorf("%w: data offset %d", ErrNotTCP, off)
	}
	return t[:off], nil
}
