package daemon_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
)

// TestHostileSocketPath: a socket path that names something other than a
// socket (a file, a directory, a symbolic link) is refused and left as it
// was, not deleted as a stale socket.
func TestHostileSocketPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "precious.txt")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty-dir")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, empty, link} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			before, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := daemon.New(c.Node(1), daemon.Config{Socket: path, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				srv.Close()
			}
			if !errors.Is(err, daemon.ErrNotSocket) || err != nil && !strings.Contains(err.Error(), path) {
				t.Errorf("socket %s: %v, want ErrNotSocket naming it", path, err)
			}
			after, err := os.Lstat(path)
			if err != nil {
				t.Fatalf("%s is gone: %v", path, err)
			}
			if after.Mode() != before.Mode() {
				t.Errorf("%s changed: %v, was %v", path, after.Mode(), before.Mode())
			}
		})
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("%s: %q %v", file, b, err)
	}
}
