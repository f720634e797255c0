package lite_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// apis starts a two-node cluster and returns node 2's embedded runtime
// and node 1's runtime two ways: embedded, and through krcored.
func apis(t testing.TB) (krcore.API, map[string]krcore.API) {
	others, node1 := testcluster.APIs(t, 2)
	return others[0], node1
}

func open(t testing.TB, api krcore.API) *lite.Node {
	t.Helper()
	n, err := lite.Open(ctxT(t), api, lite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// TestLMR: the life of an LMR, mastered on node 2 and mapped from node 1,
// the mapper embedded and through krcored.
func TestLMR(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			l, err := master.Malloc(ctx, "table", 1<<17, lite.Read)
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Repeat([]byte("lite on krcore "), 1<<17/15)
			copy(l.Bytes(), want)

			h, err := mapper.Map(ctx, 2, "table", lite.Read)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(want)) // larger than the bounce buffer
			if err := mapper.Read(ctx, h, 0, got); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("Read: %v, equal %v", err, bytes.Equal(got, want))
			}
			if err := mapper.Read(ctx, h, 1<<17-4, got[:8]); !errors.Is(err, krcore.ErrInvalid) {
				t.Fatalf("Read past the end: %v, want ErrInvalid", err)
			}
			if err := mapper.Write(ctx, h, 0, []byte("evil")); !errors.Is(err, verbs.RemAccessErr) {
				t.Fatalf("Write through a read handle: %v, want REM_ACCESS_ERR", err)
			}
			if !bytes.Equal(l.Bytes()[:4], want[:4]) {
				t.Fatal("a write through a read handle changed the LMR")
			}
			if _, err := mapper.Map(ctx, 2, "table", lite.Read|lite.Write); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Map with Write on a read-only LMR: %v, want ErrPerm", err)
			}
			if _, err := mapper.Map(ctx, 2, "nothing", lite.Read); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Map of no LMR: %v, want ErrFreed", err)
			}
			if err := master.Read(ctx, h, 0, got[:8]); !errors.Is(err, lite.ErrBadHandle) {
				t.Fatalf("another Node's handle: %v, want ErrBadHandle", err)
			}

			h2, err := mapper.Map(ctx, 2, "table", lite.Read)
			if err != nil {
				t.Fatal(err)
			}
			if err := mapper.Unmap(ctx, h2); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Read(ctx, h2, 0, got[:8]); !errors.Is(err, lite.ErrBadHandle) {
				t.Fatalf("Read after Unmap: %v, want ErrBadHandle", err)
			}

			if err := l.Free(); err != nil {
				t.Fatal(err)
			}
			// The grant is withdrawn before the memory goes: the responder
			// refuses the stale handle's READ.
			if err := mapper.Read(ctx, h, 0, got[:8]); !errors.Is(err, verbs.RemAccessErr) {
				t.Fatalf("Read after Free: %v, want REM_ACCESS_ERR", err)
			}
			if err := mapper.Unmap(ctx, h); err != nil {
				t.Fatalf("Unmap after Free: %v", err)
			}
		})
	}
}

// TestWrite: a handle mapped with Write writes the master's memory.
func TestWrite(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			l, err := master.Malloc(ctx, "log", 4096, lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			h, err := mapper.Map(ctx, 2, "log", lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			if err := mapper.Write(ctx, h, 100, []byte("entry")); err != nil {
				t.Fatal(err)
			}
			if got := string(l.Bytes()[100:105]); got != "entry" {
				t.Fatalf("master sees %q", got)
			}
		})
	}
}

// TestClose: Close stops the serving goroutine and fails a Map waiting
// for a master that never answers with ErrClosed, within a bound.
func TestClose(t *testing.T) {
	masterAPI, mappers := apis(t)
	// A mute master: node 2's LITE port takes messages and never answers.
	mute, err := masterAPI.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	if err := mute.Bind(lite.DefaultPort); err != nil {
		t.Fatal(err)
	}
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			mapper := open(t, api)
			errc := make(chan error, 1)
			go func() {
				_, err := mapper.Map(ctx, 2, "table", lite.Read)
				errc <- err
			}()
			var msg [1]krcore.Message
			if _, err := mute.PopMsgsWait(ctx, msg[:]); err != nil { // the Map is waiting now
				t.Fatal(err)
			}
			start := time.Now()
			if err := mapper.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; !errors.Is(err, krcore.ErrClosed) {
				t.Fatalf("Map waiting on a mute master at Close: %v, want ErrClosed", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("Close and the waiting Map took %v", d)
			}
			if _, err := mapper.Map(ctx, 2, "table", lite.Read); !errors.Is(err, krcore.ErrClosed) {
				t.Fatalf("Map after Close: %v, want ErrClosed", err)
			}
			// The port is free again.
			n2, err := lite.Open(ctx, api, lite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			n2.Close()
		})
	}
}
