package app

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/docker/go-units"

	"github.com/flmbox/flmbox/rootfs"
)

// ttyProgress draws one line per layer on a terminal, redrawn at most ten
// times a second.
type ttyProgress struct {
	mu     sync.Mutex
	w      io.Writer
	layers []rootfs.LayerStatus
	drawn  int // lines on screen
	last   time.Time
}

func newTTYProgress(w io.Writer) *ttyProgress { return &ttyProgress{w: w} }

// Layer implements rootfs.Progress.
func (p *ttyProgress) Layer(s rootfs.LayerStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.layers) < s.Count {
		p.layers = append(p.layers, make([]rootfs.LayerStatus, s.Count-len(p.layers))...)
	}
	p.layers[s.Index-1] = s
	if s.Phase == "fetching" && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.draw()
}

func (p *ttyProgress) draw() {
	p.last = time.Now()
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.drawn) // back to the first line
	}
	for i, s := range p.layers {
		phase, d := s.Phase, s.Digest
		if phase == "" {
			phase = "waiting"
		}
		if len(d) > 19 {
			d = d[:19]
		}
		fmt.Fprintf(&b, "\x1b[2Klayer %d/%d %s %-9s %s / %s\n", i+1, len(p.layers), d, phase,
			units.BytesSize(float64(s.Fetched)), units.BytesSize(float64(s.Size)))
	}
	p.drawn = len(p.layers)
	io.WriteString(p.w, b.String())
}

// Close draws the final state.
func (p *ttyProgress) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.layers) > 0 {
		p.draw()
	}
}

func humanSize(n int64) string { return units.BytesSize(float64(n)) }

// debugProgress logs each layer's phase changes with the time since the
// pull started (--debug), to show where a pull's time goes.
type debugProgress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
	phase map[int]string
}

func newDebugProgress(w io.Writer) *debugProgress {
	return &debugProgress{w: w, start: time.Now(), phase: map[int]string{}}
}

// Layer implements rootfs.Progress.
func (p *debugProgress) Layer(s rootfs.LayerStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase[s.Index] == s.Phase {
		return
	}
	p.phase[s.Index] = s.Phase
	fmt.Fprintf(p.w, "%8.1f ms  layer %d/%d %s %s (%s)\n", float64(time.Since(p.start).Microseconds())/1000,
		s.Index, s.Count, s.Digest, s.Phase, units.BytesSize(float64(s.Size)))
}
