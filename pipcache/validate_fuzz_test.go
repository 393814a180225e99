package pipcache

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

// FuzzValidate: whatever the bytes, Validate returns (no panic, no
// unbounded read: the limits are small here) and every refusal is an
// invalid-argument error.
func FuzzValidate(f *testing.F) {
	f.Add(wheeltest.Build("hello", "1.0", helloFiles))
	f.Add(hello(add(wheeltest.Entry{Name: "../evil", Body: []byte("x")})))
	f.Add(lyingBomb()[:4096])
	f.Add([]byte("PK\x05\x06" + string(make([]byte, 18))))
	limits := &Limits{MaxWheelBytes: 1 << 20, MaxUnpackedBytes: 4 << 20, MaxEntries: 1000, MaxMetadataBytes: 64 << 10, MaxRecordBytes: 64 << 10}
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := Validate(context.Background(), bytes.NewReader(b), int64(len(b)), "hello-1.0-py3-none-any.whl", limits)
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("a refusal that is not an invalid argument: %v", err)
		}
		if err == nil && (w.Name != "hello" || w.Size != int64(len(b))) {
			t.Fatalf("accepted %+v", w)
		}
	})
}
