package snippet

import (
	"sync"

	"github.com/flmbox/flmbox/snippet/wire"
)

// capture keeps the head and the tail of a stream in at most max bytes:
// the first max/2 bytes as they come, the last max-max/2 bytes in a ring
// buffer, and the count of everything written. Memory grows with the output
// up to max and never beyond, whatever is written.
type capture struct {
	mu    sync.Mutex
	max   int64
	head  []byte // up to max/2 bytes
	ring  []byte // grows up to max-max/2 bytes, then wraps
	next  int    // where the ring's next byte goes once it is full
	total int64
}

func newCapture(max int64) *capture {
	return &capture{max: max}
}

// Write keeps what fits and counts the rest; it never fails.
func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	c.total += int64(n)
	if room := int(c.max/2) - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	size := int(c.max - c.max/2)
	if size == 0 || len(p) == 0 {
		return n, nil
	}
	if len(p) >= size { // p alone fills the ring
		c.ring = append(c.ring[:0], p[len(p)-size:]...)
		c.next = 0
		return n, nil
	}
	if room := size - len(c.ring); room > 0 { // still filling
		k := min(room, len(p))
		c.ring = append(c.ring, p[:k]...)
		p = p[k:]
	}
	for len(p) > 0 { // full: overwrite the oldest bytes
		k := copy(c.ring[c.next:], p)
		p = p[k:]
		c.next = (c.next + k) % size
	}
	return n, nil
}

// Output returns what was kept: the head as Data and, when bytes were
// dropped, the tail as Tail.
func (c *capture) Output() wire.Output {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := int64(len(c.head) + len(c.ring))
	out := wire.Output{Total: c.total, Truncated: c.total > kept}
	if !out.Truncated { // the ring has not wrapped: next is 0
		out.Data = append(append(make([]byte, 0, kept), c.head...), c.ring...)
		return out
	}
	out.Data = append([]byte(nil), c.head...)
	out.Tail = append(append(make([]byte, 0, len(c.ring)), c.ring[c.next:]...), c.ring[:c.next]...)
	return out
}
