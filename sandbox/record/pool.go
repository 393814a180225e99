package record

import (
	"os"
	"sort"
	"strings"

	"github.com/flmbox/flmbox/internal/flock"
	"github.com/flmbox/flmbox/internal/stateroot"
)

// All reads the record of every sandbox of root, whatever name it holds
// (see ReadDir); unreadable ones are left out.
func All(root string) []*Record {
	ents, _ := os.ReadDir(stateroot.Sandboxes(root))
	var out []*Record
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if rec, err := ReadDir(stateroot.Sandbox(root, e.Name())); err == nil {
			out = append(out, rec)
		}
	}
	return out
}

// Idle returns the records of the idle pooled sandboxes of shape key in
// root, the most recently parked first (their memory is the likeliest to be
// in the host's caches); all shapes' if key is empty.
func Idle(root, key string) []*Record {
	return idleOf(All(root), key)
}

func idleOf(recs []*Record, key string) []*Record {
	var out []*Record
	for _, rec := range recs {
		if rec.Pooled != nil && (key == "" || rec.Shape == key) && rec.State == Running && !rec.Renamed() {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pooled.After(*out[j].Pooled) })
	return out
}

// LockIdle takes the lock of the directory of rec, an idle pooled sandbox,
// without waiting, and reads its record again: the caller adopts it under
// the lock (its agent answering, the record written with Pooled nil) and
// then unlocks. It returns nil if another process holds the lock, or took,
// removed or renamed the sandbox first.
func LockIdle(rec *Record) (_ *Record, unlock func()) {
	l, err := flock.TryLockDir(rec.Dir, flock.Exclusive)
	if err != nil {
		return nil, nil
	}
	if rec, err = ReadDir(rec.Dir); err != nil || rec.Pooled == nil || rec.Renamed() {
		l.Unlock()
		return nil, nil
	}
	return rec, func() { l.Unlock() }
}
