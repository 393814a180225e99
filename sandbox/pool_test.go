package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
)

// testShape is a shape with every field set.
func testShape() shape {
	return shape{Manifest: "sha256:" + strings.Repeat("ab", 32), Network: "none", Platform: "ptrace",
		Limits: record.Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 256}, TmpBytes: 256 << 20,
		Env: []string{"A=1", "B=2"}, Pip: []string{"numpy==2.0"}, Mounts: []Mount{{Source: "/data", Destination: "/data"}},
		Protocol: 3, Agent: "4700000-1764600000000000000"}
}

// TestShapeKey: a shape's key is stable (the same today as when pools were
// written: a key that changed between builds would strand every pool's
// settings and idle sandboxes), and changes with each field, so that no two
// shapes share a pool.
func TestShapeKey(t *testing.T) {
	s := testShape()
	const golden = "81c80b03880338da"
	if k := s.key(); k != golden {
		t.Errorf("key of the test shape = %s, want %s: changing a shape's JSON strands every pool", k, golden)
	}
	if k := testShape().key(); k != s.key() || len(k) != 16 {
		t.Errorf("keys of equal shapes differ: %s, %s", k, s.key())
	}
	changes := map[string]func(*shape){
		"Manifest":    func(s *shape) { s.Manifest = "sha256:" + strings.Repeat("cd", 32) },
		"Network":     func(s *shape) { s.Network = "egress" },
		"Platform":    func(s *shape) { s.Platform = "" },
		"Limits":      func(s *shape) { s.Limits.MemoryBytes++ },
		"Limits.CPUs": func(s *shape) { s.Limits.CPUs = 0.5 },
		"Limits.Pids": func(s *shape) { s.Limits.Pids = 64 },
		"TmpBytes":    func(s *shape) { s.TmpBytes = 1 << 20 },
		"Env":         func(s *shape) { s.Env = []string{"A=1"} },
		"Env order":   func(s *shape) { s.Env = []string{"B=2", "A=1"} }, // the last setting of a variable wins
		"Pip":         func(s *shape) { s.Pip = nil },
		"Mounts":      func(s *shape) { s.Mounts[0].ReadWrite = true },
		"Protocol":    func(s *shape) { s.Protocol = 2 },
		"Agent":       func(s *shape) { s.Agent = "4700001-1764600000000000000" },
		"LazySpares":  func(s *shape) { s.LazySpares = true },
		"Fetch":       func(s *shape) { s.Fetch = true },
		"Egress": func(s *shape) {
			r, _ := ParseEgressRule("pypi.org")
			s.Network, s.Egress = "egress", &Egress{Allow: []EgressRule{r}}
		},
	}
	// Every field of shape has a change here: a field added later must be
	// in the key, and in this test.
	typ := reflect.TypeOf(shape{})
	for i := range typ.NumField() {
		if _, ok := changes[typ.Field(i).Name]; !ok {
			t.Errorf("shape.%s has no change in this test", typ.Field(i).Name)
		}
	}
	seen := map[string]string{s.key(): "the test shape"}
	for name, change := range changes {
		c := testShape()
		change(&c)
		k := c.key()
		if other, ok := seen[k]; ok {
			t.Errorf("changing %s gives the key of %s: %s", name, other, k)
		}
		seen[k] = "changed " + name
	}
}

// TestShapeOfSpec: the Spec a pool makes its sandboxes from (shape.spec)
// has the pool's shape, so that a refill's sandboxes are parked in it.
func TestShapeOfSpec(t *testing.T) {
	s := testShape()
	s.Protocol = shapeFrom(Spec{}, "", "").Protocol // this build's
	spec, err := s.spec("example.com/python:3").withDefaults("")
	if err != nil {
		t.Fatal(err)
	}
	if got := shapeFrom(spec, s.Manifest, s.Agent); got.key() != s.key() {
		t.Errorf("shape of the pool's spec = %+v, want %+v", got, s)
	}
	// A spec with its defaults filled in has the shape of the same spec
	// without them: run --image without flags finds the pool that pool
	// fill without flags made.
	bare, err := Spec{Image: "example.com/python:3"}.withDefaults("")
	if err != nil {
		t.Fatal(err)
	}
	again, err := bare.withDefaults("")
	if err != nil {
		t.Fatal(err)
	}
	if shapeFrom(bare, s.Manifest, s.Agent).key() != shapeFrom(again, s.Manifest, s.Agent).key() {
		t.Errorf("filling in a spec's defaults twice changes its shape: %+v, %+v", bare, again)
	}
}

// TestPoolConfig: a pool's settings read back as written; damaged ones (not
// JSON, or not of the shape their file names) are ignored with a warning,
// as if the pool had none.
func TestPoolConfig(t *testing.T) {
	root := t.TempDir()
	var warnings []string
	m, err := Open(root, WithRunsc("/no/such/runsc"), WithWarnf(func(f string, a ...any) {
		warnings = append(warnings, fmt.Sprintf(f, a...))
	}))
	if err != nil {
		t.Fatal(err)
	}
	s := testShape()
	key := s.key()
	if c := m.readPool(key); c != nil || len(m.poolKeys()) != 0 {
		t.Fatalf("settings of a pool never filled: %+v, keys %q", c, m.poolKeys())
	}
	want := &poolConfig{Image: "example.com/python:3", Shape: s, Size: 3, IdleTimeout: 90 * time.Second}
	if err := m.writePool(key, want); err != nil {
		t.Fatal(err)
	}
	if got := m.readPool(key); !reflect.DeepEqual(got, want) {
		t.Errorf("readPool = %+v, want %+v", got, want)
	}
	if keys := m.poolKeys(); !slices.Equal(keys, []string{key}) {
		t.Errorf("poolKeys = %q, want [%s]", keys, key)
	}
	if ents, _ := os.ReadDir(stateroot.Pool(root)); len(ents) != 1 {
		t.Errorf("the pool's directory holds %v, want its settings alone (no temporary file)", ents)
	}
	noTimeout := *want
	noTimeout.IdleTimeout = 0
	if err := m.writePool(key, &noTimeout); err != nil {
		t.Fatal(err)
	}
	if got := m.readPool(key); got == nil || got.IdleTimeout != DefaultIdleTimeout {
		t.Errorf("settings without an idle timeout read as %+v, want the default %s", got, DefaultIdleTimeout)
	}
	if len(warnings) != 0 {
		t.Fatalf("warnings about sound settings: %q", warnings)
	}

	other := s
	other.TmpBytes++ // another pool's shape
	for _, tc := range []struct {
		name  string
		write func(path string) error
	}{
		{"not JSON", func(p string) error { return os.WriteFile(p, []byte(`{"image": "x", "size": 2`), 0o600) }},
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o600) }},
		{"another shape's", func(p string) error {
			return m.writePool(key, &poolConfig{Image: want.Image, Shape: other, Size: 3})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warnings = nil
			if err := tc.write(m.poolPath(key, ".json")); err != nil {
				t.Fatal(err)
			}
			if c := m.readPool(key); c != nil {
				t.Errorf("damaged settings read as %+v", c)
			}
			// Another shape's settings are another flmbox's (whose shapes
			// hold other fields): ignored without a word.
			if wantWarn := tc.name != "another shape's"; wantWarn != (len(warnings) == 1) ||
				wantWarn && (!strings.Contains(warnings[0], key) || !strings.Contains(warnings[0], "damaged")) {
				t.Errorf("warnings %q, want one naming pool %s as damaged: %t", warnings, key, wantWarn)
			}
		})
	}
	if c := m.readPool(""); c != nil {
		t.Errorf("readPool of no shape (a sandbox made before pools) = %+v", c)
	}
}

// TestPooled: the idle sandboxes of a shape are its running records with a
// Pooled time that hold their own directory's name, the most recently
// parked first; in-use, other shapes', half-renamed and removing ones are
// not idle.
func TestPooled(t *testing.T) {
	root := t.TempDir()
	m, err := Open(root, WithRunsc("/no/such/runsc"))
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) *time.Time { p := time.Now().Add(-d).UTC(); return &p }
	writeRecord(t, root, record.Record{Name: "pool-old", State: record.Running, Shape: "k", Pooled: at(time.Hour)})
	writeRecord(t, root, record.Record{Name: "pool-new", State: record.Running, Shape: "k", Pooled: at(time.Minute)})
	writeRecord(t, root, record.Record{Name: "pool-other", State: record.Running, Shape: "j", Pooled: at(time.Minute)})
	writeRecord(t, root, record.Record{Name: "in-use", State: record.Running, Shape: "k"})
	writeRecord(t, root, record.Record{Name: "pool-removing", State: record.Removing, Shape: "k", Pooled: at(time.Minute)})
	// An Acquire killed between its rename and its record's write.
	renamed := writeRecord(t, root, record.Record{Name: "pool-renamed", State: record.Running, Shape: "k", Pooled: at(time.Second)})
	if err := os.Rename(renamed, stateroot.Sandbox(root, "work")); err != nil {
		t.Fatal(err)
	}
	names := func(recs []*record.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, r.Name)
		}
		return out
	}
	if got := names(m.pooled("k")); !slices.Equal(got, []string{"pool-new", "pool-old"}) {
		t.Errorf("pooled(k) = %q, want [pool-new pool-old]", got)
	}
	if got := names(m.pooled("")); !slices.Equal(got, []string{"pool-new", "pool-other", "pool-old"}) &&
		!slices.Equal(got, []string{"pool-other", "pool-new", "pool-old"}) {
		t.Errorf("pooled() = %q, want every shape's, the oldest last", got)
	}
	if got := m.pooled("none"); len(got) != 0 {
		t.Errorf("pooled(none) = %q", names(got))
	}
}

// TestReconcileRenamed: a sandbox whose record names another directory (an
// Acquire or Release killed between the rename and the record's write) is
// removed by Reconcile, saying so, and never offered as idle meanwhile.
func TestReconcileRenamed(t *testing.T) {
	root := t.TempDir()
	var warnings []string
	m, err := Open(root, WithRunsc("/no/such/runsc"), WithWarnf(func(f string, a ...any) {
		warnings = append(warnings, fmt.Sprintf(f, a...))
	}))
	if err != nil {
		t.Fatal(err)
	}
	parked := time.Now().UTC()
	for _, tc := range []struct{ from, to string }{
		{"pool-0123456789ab", "work"},  // adopted as work
		{"work2", "pool-ba9876543210"}, // released into the pool
	} {
		dir := writeRecord(t, root, record.Record{Name: tc.from, State: record.Running, Shape: "k", Pooled: &parked})
		if err := os.Rename(dir, stateroot.Sandbox(root, tc.to)); err != nil {
			t.Fatal(err)
		}
	}
	kept := writeRecord(t, root, record.Record{Name: "pool-kept", State: record.Running, Shape: "k", Pooled: &parked})
	if got := m.pooled("k"); len(got) != 1 || got[0].Name != "pool-kept" {
		t.Errorf("idle: %v, want pool-kept alone", got)
	}
	if err := m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"work", "pool-ba9876543210"} {
		if _, err := os.Stat(stateroot.Sandbox(root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("renamed sandbox %s is left: %v", gone, err)
		}
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("the idle sandbox was removed: %v", err)
	}
	want := []string{
		"removing sandbox pool-ba9876543210, which an interrupted flmbox left renamed from work2 (taking it from a pool or giving it back)",
		"removing sandbox work, which an interrupted flmbox left renamed from pool-0123456789ab (taking it from a pool or giving it back)",
	}
	slices.Sort(warnings)
	if !slices.Equal(warnings, want) {
		t.Errorf("warnings %q, want %q", warnings, want)
	}
}

// TestPoolOptions: sizes out of bounds and negative idle timeouts are
// refused before anything is made.
func TestPoolOptions(t *testing.T) {
	for _, o := range []PoolOptions{{Size: -1}, {Size: MaxPoolSize + 1}, {Size: 1, IdleTimeout: -time.Second}} {
		if err := checkPoolOptions(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	for _, o := range []PoolOptions{{}, {Size: MaxPoolSize, IdleTimeout: time.Second}} {
		if err := checkPoolOptions(o); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}
