package lite_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// TestRegister: memory the caller registered becomes an LMR that mappers
// read and write; Free withdraws the grants and leaves the memory
// registered and the caller's.
func TestRegister(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			mr, err := masterAPI.RegMR(8192, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			defer masterAPI.Deregister(mr)
			copy(mr.Bytes(), "registered")
			l, err := master.Register(ctx, "mine", mr, lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			if &l.Bytes()[0] != &mr.Bytes()[0] {
				t.Fatal("the LMR's bytes are not the caller's MR")
			}
			h, err := mapper.Map(ctx, 2, "mine", lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 10)
			if err := mapper.Read(ctx, h, 0, got); err != nil || string(got) != "registered" {
				t.Fatalf("Read: %q, %v", got, err)
			}
			if err := mapper.Write(ctx, h, 8000, []byte("back")); err != nil || string(mr.Bytes()[8000:8004]) != "back" {
				t.Fatalf("Write: %v; the MR has %q", err, mr.Bytes()[8000:8004])
			}
			if err := l.Free(); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Read(ctx, h, 0, got); !errors.Is(err, verbs.RemAccessErr) {
				t.Fatalf("Read after Free: %v, want REM_ACCESS_ERR", err)
			}
			if !bytes.Equal(mr.Bytes()[:10], []byte("registered")) {
				t.Fatal("Free released the caller's MR")
			}
		})
	}
}

// TestRegisterInvalid: memory without the remote access the LMR allows,
// or not this API's, is refused at Register, not at the first Map.
func TestRegisterInvalid(t *testing.T) {
	masterAPI, mappers := apis(t)
	ctx := ctxT(t)
	master := open(t, masterAPI)
	ro, err := masterAPI.RegMR(64, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.Register(ctx, "ro", ro, lite.Read|lite.Write); !errors.Is(err, krcore.ErrInvalid) {
		t.Fatalf("Register read-only memory allowing Write: %v, want ErrInvalid", err)
	}
	if _, err := master.Register(ctx, "ro", nil, lite.Read); !errors.Is(err, krcore.ErrInvalid) {
		t.Fatalf("Register nil: %v, want ErrInvalid", err)
	}
	other, err := mappers["embedded"].RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.Register(ctx, "other", other, lite.Read); !errors.Is(err, krcore.ErrRefused) {
		t.Fatalf("Register another runtime's MR: %v, want ErrRefused", err)
	}
	if _, err := master.Register(ctx, "ro", ro, lite.Read); err != nil { // the names are free
		t.Fatal(err)
	}
}
