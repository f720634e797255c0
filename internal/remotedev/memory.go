package remotedev

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// fileID is a memfd's identity. While the server maps a memfd the inode
// stays alive, so no other memfd can take its number: a cached mapping is
// never confused with a new block that reuses the client's fd number.
type fileID struct{ dev, ino uint64 }

// mapping is the server's view of one client block, shared by every
// registration inside it.
type mapping struct {
	blk  *offheap.Block
	refs int
}

// memCache maps client blocks on demand, once each.
type memCache struct {
	mu sync.Mutex
	m  map[fileID]*mapping
}

// acquire returns the server's view of ref's bytes and a release to call
// once the registration over them is gone.
func (mc *memCache) acquire(ref *memRef) ([]byte, func(), error) {
	if ref.Size <= 0 || ref.Off < 0 || ref.Len <= 0 || ref.Off > ref.Size-ref.Len {
		return nil, nil, fmt.Errorf("remote: range [%d,+%d) of a %d-byte block: %w", ref.Off, ref.Len, ref.Size, verbs.ErrInvalid)
	}
	id := fileID{ref.Dev, ref.Ino}
	mc.mu.Lock()
	defer mc.mu.Unlock()
	mp := mc.m[id]
	if mp == nil {
		blk, err := openBlock(ref, id)
		if err != nil {
			return nil, nil, err
		}
		if mc.m == nil {
			mc.m = make(map[fileID]*mapping)
		}
		mp = &mapping{blk: blk}
		mc.m[id] = mp
	}
	if mp.blk.Len() < ref.Off+ref.Len {
		return nil, nil, fmt.Errorf("remote: range [%d,+%d) beyond the %d bytes mapped: %w", ref.Off, ref.Len, mp.blk.Len(), verbs.ErrInvalid)
	}
	mp.refs++
	var once sync.Once
	release := func() { once.Do(func() { mc.release(id) }) }
	return mp.blk.Bytes()[ref.Off : ref.Off+ref.Len], release, nil
}

// openBlock maps the client's memfd and checks it is the block the client
// described (the fd may have been closed and reused since).
func openBlock(ref *memRef, id fileID) (*offheap.Block, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", ref.PID, ref.FD)
	blk, err := offheap.OpenFile(path, ref.Size)
	if err != nil {
		return nil, fmt.Errorf("remote: map client memory %s: %w", path, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(blk.FD(), &st); err != nil {
		blk.Close()
		return nil, fmt.Errorf("remote: stat %s: %w", path, err)
	}
	if (fileID{uint64(st.Dev), st.Ino}) != id {
		blk.Close()
		return nil, fmt.Errorf("remote: %s is no longer the client's block: %w", path, verbs.ErrInvalid)
	}
	return blk, nil
}

func (mc *memCache) release(id fileID) {
	mc.mu.Lock()
	mp := mc.m[id]
	mp.refs--
	if mp.refs > 0 {
		mc.mu.Unlock()
		return
	}
	delete(mc.m, id)
	mc.mu.Unlock()
	// A block still pinned means the RNIC kept a registration we could not
	// close; leaving it mapped is the safe failure.
	mp.blk.Close()
}
