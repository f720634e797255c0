// Package nonce draws numbers that another process must not guess (keys,
// tokens, first ids and sequence numbers) from crypto/rand.
package nonce

import (
	"crypto/rand"
	"encoding/binary"
)

// Uint64 is 64 bits from crypto/rand.
func Uint64() uint64 {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand.Read's contract)
	return binary.LittleEndian.Uint64(b[:])
}

// Uint32 is 32 bits from crypto/rand.
func Uint32() uint32 {
	var b [4]byte
	rand.Read(b[:]) // never fails (crypto/rand.Read's contract)
	return binary.LittleEndian.Uint32(b[:])
}
