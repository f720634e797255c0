package lite_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
)

// TestGrantBoundToProcess: a grant is exported to its mapper's principal
// (node 1, the LITE port) alone. Another process that learned its export
// name (read here out of the master's state) cannot look it up, so cannot
// READ the memory: a second client of the same krcored (or a second Node
// of the same runtime) asking as no port, unbound, or bound to another
// port of the right node (it cannot take the mapper's: ErrPortInUse), and
// a process of another node holding the LITE port, all get ErrNoRegion,
// and a Memcpy leaves no loan behind; the mapper keeps reading.
func TestGrantBoundToProcess(t *testing.T) {
	c, sock := testcluster.StartDaemon(t, 3)
	for name, mk := range map[string]func() krcore.API{
		"embedded": func() krcore.API { return core.Embed(c.Node(1)) },
		"daemon":   func() krcore.API { return testcluster.Attach(t, sock) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, core.Embed(c.Node(2))), open(t, mk())
			l := malloc(t, master, "bound", 4096, lite.Read|lite.Write)
			want := pattern(4096)
			copy(l.Bytes(), want)
			h := mapLMR(t, mapper, 2, "bound", lite.Read|lite.Write)
			exps := lite.GrantExports(l)
			if len(exps) != 1 {
				t.Fatalf("grants at the master: %q, want one", exps)
			}
			exp := exps[0]

			thieves := map[string]krcore.API{"node 1, another process": mk(), "node 3": core.Embed(c.Node(3))}
			for who, api := range thieves {
				if _, err := api.Region(ctx, 2, exp); !errors.Is(err, krcore.ErrNoRegion) {
					t.Errorf("%s asking as no port: %v, want ErrNoRegion", who, err)
				}
				q, err := api.Queue()
				if err != nil {
					t.Fatal(err)
				}
				defer q.Close()
				if err := q.Connect(ctx, 2, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := q.Region(ctx, exp); !errors.Is(err, krcore.ErrNoRegion) {
					t.Errorf("%s unbound: %v, want ErrNoRegion", who, err)
				}
				err = q.Bind(lite.DefaultPort)
				switch {
				case api.Node() == 1 && !errors.Is(err, krcore.ErrPortInUse):
					t.Errorf("%s took the mapper's port: %v, want ErrPortInUse", who, err)
				case api.Node() == 1:
					err = q.Bind(lite.DefaultPort + 1) // the right node, a wrong port
				}
				if err != nil {
					t.Fatal(err)
				}
				if _, err := q.Region(ctx, exp); !errors.Is(err, krcore.ErrNoRegion) {
					t.Errorf("%s bound to another principal's port: %v, want ErrNoRegion", who, err)
				}
			}

			// The mapper still reads, and copies between nodes through
			// loans to dst's holder, one per grant and holder, withdrawn
			// with the grant lent.
			got := make([]byte, 4096)
			if err := mapper.Read(ctx, h, 0, got); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("the mapper's Read: %v (bytes equal: %v)", err, bytes.Equal(got, want))
			}
			local := malloc(t, mapper, "local", 4096, lite.Read|lite.Write)
			hl := mapLMR(t, mapper, 1, "local", lite.Read|lite.Write)
			for range 2 {
				if err := mapper.Memcpy(ctx, hl, 0, h, 0, 4096); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(local.Bytes(), l.Bytes()) {
					t.Fatal("Memcpy from node 2 to node 1: dst differs")
				}
				if err := mapper.Memcpy(ctx, h, 100, hl, 1, 50); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(l.Bytes()[100:150], local.Bytes()[1:51]) {
					t.Fatal("Memcpy from node 1 to node 2: dst differs")
				}
			}
			if k, kl := len(lite.GrantExports(l)), len(lite.GrantExports(local)); k != 2 || kl != 2 {
				t.Errorf("grants after two rounds of Memcpy: %d on l, %d on local; want the mapper's and one loan each", k, kl)
			}
			for _, m := range []lite.Handle{h, hl} {
				if err := mapper.Unmap(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			if exps, el := lite.GrantExports(l), lite.GrantExports(local); len(exps) != 0 || len(el) != 0 {
				t.Errorf("grants left after Unmap: %q on l, %q on local", exps, el)
			}
		})
	}
}

// TestCloseUnmaps: a Node's Close has what it mapped withdrawn, loans too, so
// a process that binds the LITE port after it (through the same krcored,
// or the same runtime) finds none of its grants, though it knows their
// names.
func TestCloseUnmaps(t *testing.T) {
	c, sock := testcluster.StartDaemon(t, 2)
	for name, api := range map[string]krcore.API{"embedded": core.Embed(c.Node(1)), "daemon": testcluster.Attach(t, sock)} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, core.Embed(c.Node(2))), open(t, api)
			l := malloc(t, master, "closed", 4096, lite.Read|lite.Write)
			malloc(t, mapper, "local", 4096, lite.Read|lite.Write)
			h := mapLMR(t, mapper, 2, "closed", lite.Read)
			mapLMR(t, mapper, 2, "closed", lite.Read|lite.Write)
			hl := mapLMR(t, mapper, 1, "local", lite.Write)
			if err := mapper.Memcpy(ctx, hl, 0, h, 0, 4096); err != nil { // a loan to node 1
				t.Fatal(err)
			}
			names := lite.GrantExports(l)
			if len(names) != 3 {
				t.Fatalf("grants before Close: %q, want two Maps and a loan", names)
			}
			if err := mapper.Close(); err != nil {
				t.Fatal(err)
			}
			// Close does not wait for the master's answers.
			for left := lite.GrantExports(l); len(left) != 0; left = lite.GrantExports(l) {
				if ctx.Err() != nil {
					t.Fatalf("grants after the mapper's Close: %q", left)
				}
				time.Sleep(time.Millisecond) // polling the master's state
			}
			heir := open(t, api) // binds the LITE port again
			for _, exp := range names {
				if _, err := lite.RegionAs(ctx, heir, 2, exp); !errors.Is(err, krcore.ErrNoRegion) {
					t.Errorf("the port's next holder found %q: %v, want ErrNoRegion", exp, err)
				}
			}
		})
	}
}
