// Package racekv is a disaggregated key-value store on RACE hashing (Zuo,
// Shu et al., USENIX ATC'21): memory nodes hold the hash table and the
// key-value blocks, and compute clients reach them with one-sided RDMA
// alone, so a client is a process that can come and go.
//
// # Layout
//
// The table is split into subtables, spread round-robin over the memory
// nodes (subtable s lives on node s mod K). A subtable is an array of
// bucket groups; a group is three 64-byte buckets, main A, overflow, main
// B, so that main A with the overflow and the overflow with main B are two
// combined buckets, each 128 contiguous bytes that one RDMA READ fetches. A
// bucket is eight 8-byte slots; a slot holds a fingerprint (8 bits), the
// length of a key-value block in 64-byte units (8 bits) and the block's
// offset in the memory node's region (48 bits), or 0 when empty. A key
// hashes to one subtable and to two combined buckets in it.
//
// # Operations
//
//   - Get reads both combined buckets (two READs in flight), then the
//     blocks whose fingerprints match (READs in flight together), and
//     returns the first, in the buckets' order, whose key matches.
//   - Put writes a new block out of place (a WRITE into space the client
//     took from the node's heap with one FETCH_ADD per 64 KiB chunk),
//     then swings the key's slot to it with one CAS, or takes an empty
//     slot of the less loaded combined bucket with one CAS; a failed CAS
//     reads the buckets again and retries. After taking an empty slot it
//     reads the buckets again: a concurrent insert of the same key may
//     have taken another, and only the first in the buckets' order stays.
//
// A block is never written after its slot points at it, so a READ never
// sees half a value, and a client that dies between its block WRITE and
// its CAS leaves the table as it was (the block is lost space).
//
// Not built, against the paper: resizing (RACE's lock-free extendible
// directory: here the subtables are fixed at format time and a full
// bucket pair fails a Put with ErrFull), deletes, and reuse of the space
// of replaced blocks.
//
// # Transports
//
// A client reaches each memory node through a Memory: VQ (a krcore
// virtual queue, embedded or through krcored), RC (a raw RC queue pair the
// client creates and connects itself, exchanging endpoints with the memory
// node over TCP, as a verbs program does) or Local (the bytes in this
// process: loading and tests). Node is the memory node's side of all three.
package racekv
