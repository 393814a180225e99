package app

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/rootfs"
)

func TestTTYProgressDrawsALinePerLayer(t *testing.T) {
	var b bytes.Buffer
	p := newTTYProgress(&b)
	p.Layer(rootfs.LayerStatus{Index: 2, Count: 2, Digest: "sha256:" + strings.Repeat("b", 64), Size: 2 << 20, Fetched: 1 << 20, Phase: "fetching"})
	p.Layer(rootfs.LayerStatus{Index: 1, Count: 2, Digest: "sha256:" + strings.Repeat("a", 64), Size: 1 << 20, Fetched: 1 << 20, Phase: "done"})
	p.Close()
	out := b.String()
	for _, want := range []string{"layer 1/2 sha256:aaaaaaaaaaaa done", "layer 2/2 sha256:bbbbbbbbbbbb fetching  1MiB / 2MiB", "\x1b[2A"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress output lacks %q:\n%q", want, out)
		}
	}
}
