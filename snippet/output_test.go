package snippet

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestCapture(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		max    int64
		writes []string
		want   string // head|tail when truncated
		trunc  bool
	}{
		{"nothing", 10, nil, "", false},
		{"short", 10, []string{"abc"}, "abc", false},
		{"exactly max", 10, []string{"0123456789"}, "0123456789", false},
		{"one over", 10, []string{"0123456789a"}, "01234|6789a", true},
		{"long", 10, []string{"0123456789abcdefghij"}, "01234|fghij", true},
		{"many small writes", 10, []string{"01", "23", "45", "67", "89", "ab", "cd", "ef", "gh", "ij"}, "01234|fghij", true},
		{"write larger than the ring", 10, []string{"012", "3456789abcdefghij"}, "01234|fghij", true},
		{"odd max", 5, []string{"0123456789"}, "01|789", true},
		{"max 1", 1, []string{"abc"}, "|c", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCapture(tc.max)
			var total int64
			for _, w := range tc.writes {
				if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				total += int64(len(w))
			}
			out := c.Output()
			got := string(out.Data)
			if out.Truncated {
				got += "|" + string(out.Tail)
			} else if out.Tail != nil {
				t.Fatalf("Tail %q of an output kept whole", out.Tail)
			}
			if got != tc.want || out.Total != total || out.Truncated != tc.trunc {
				t.Fatalf("Output = %q total %d truncated %v, want %q total %d truncated %v",
					got, out.Total, out.Truncated, tc.want, total, tc.trunc)
			}
		})
	}
}

// TestCaptureRandom compares the capture with a reference that keeps
// everything, for random write sizes.
func TestCaptureRandom(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		max := int64(r.IntN(64) + 1)
		c := newCapture(max)
		var all []byte
		for w := r.IntN(20); w > 0; w-- {
			p := make([]byte, r.IntN(40))
			for j := range p {
				p[j] = byte(r.IntN(256))
			}
			c.Write(p)
			all = append(all, p...)
		}
		want, wantTail := all, []byte(nil)
		if int64(len(all)) > max {
			want, wantTail = all[:max/2], all[int64(len(all))-(max-max/2):]
		}
		out := c.Output()
		if !bytes.Equal(out.Data, want) || !bytes.Equal(out.Tail, wantTail) || out.Total != int64(len(all)) || out.Truncated != (wantTail != nil) {
			t.Fatalf("max %d, %d bytes written: Output = %q + %q (truncated %v), want %q + %q", max, len(all), out.Data, out.Tail, out.Truncated, want, wantTail)
		}
	}
}
