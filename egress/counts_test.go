package egress

import (
	"path/filepath"
	"reflect"
	"testing"
)

// TestCountBook: counts never go down across tables made again; what a
// table counted is booked once.
func TestCountBook(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counts.json")
	b := readBook(path)
	if !b.see(map[string]uint64{"metadata": 3, "host": 1}) || b.see(map[string]uint64{"metadata": 2}) {
		t.Fatal("see: a higher count is news, a lower one is not")
	}
	if err := b.write(path); err != nil {
		t.Fatal(err)
	}
	b = readBook(path)
	b.carry() // the table is made again: it starts at zero
	if err := b.write(path); err != nil {
		t.Fatal(err)
	}
	b = readBook(path)
	b.see(map[string]uint64{"metadata": 1})
	if got, want := b.total(map[string]uint64{"metadata": 1}), map[string]uint64{"metadata": 4, "host": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("total %v, want %v", got, want)
	}
	b.carry()
	b.carry() // twice (two repairs before any read): nothing counted twice
	if got, want := b.total(nil), map[string]uint64{"metadata": 4, "host": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("total %v, want %v", got, want)
	}
}
