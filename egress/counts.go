package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"

	"github.com/flmbox/flmbox/internal/atomicfile"
)

// A table's counters go with it: a table made again (Ensure, Recreate)
// starts at zero. So that a sandbox's refusal counts never go down, its
// Network keeps a book (Network.Counts, a file): what earlier tables
// counted (Carried), and what the current one had counted when last read
// (Seen). A table made again carries what was seen of the one before; what
// a table counted between its last read and a flush that took it is lost
// (every `sandbox ls` and every Reconcile reads).
type countBook struct {
	Carried map[string]uint64 `json:"carried"`
	Seen    map[string]uint64 `json:"seen"`
}

func readBook(path string) countBook {
	var b countBook
	if data, err := os.ReadFile(path); err == nil {
		json.Unmarshal(data, &b)
	}
	if b.Carried == nil {
		b.Carried = map[string]uint64{}
	}
	if b.Seen == nil {
		b.Seen = map[string]uint64{}
	}
	return b
}

func (b countBook) write(path string) error {
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("keep the refusal counts: %w", err)
	}
	return nil
}

// see notes counts read from the current table; it reports whether the
// book changed.
func (b countBook) see(counts map[string]uint64) bool {
	changed := false
	for class, n := range counts {
		if n > b.Seen[class] {
			b.Seen[class], changed = n, true
		}
	}
	return changed
}

// carry moves what was seen of a table into Carried: the table is made
// again.
func (b *countBook) carry() {
	for class, n := range b.Seen {
		b.Carried[class] += n
	}
	b.Seen = map[string]uint64{}
}

// total is Carried plus counts, the current table's.
func (b countBook) total(counts map[string]uint64) map[string]uint64 {
	out := maps.Clone(b.Carried)
	for class, n := range counts {
		out[class] += n
	}
	return out
}

// carryCounts reads the sandbox's table's counts if it has one, and books
// them as carried: the table is about to be made again.
func (n *Network) carryCounts() error {
	if n.Counts == "" {
		return nil
	}
	b := readBook(n.Counts)
	if counts, err := classCounts(n.ID); err == nil {
		b.see(counts)
	} else if !errors.Is(err, errNoTable) {
		return err
	}
	b.carry()
	return b.write(n.Counts)
}
