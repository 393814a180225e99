package snippet

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Spares.
//
// Starting an interpreter under gVisor costs more than running a small
// snippet. With Agent.Spares, the agent starts the process of the next
// snippet of each language ahead of time, as soon as a call ends: a spare
// waits, blocked on its gate with its limits set, and the next request of its
// language and limits takes it, writes its code and only waits for the code
// itself. Each call still gets a process that has run nothing before it.
//
// Python spares are forked by a zygote, a python3 started once (at the
// first Python call) that forks a child per request: a fork costs much less
// than a new python3 under gVisor, and it leaves the sandbox's CPU free
// sooner for the next call. A zygote's children share its startup state, so
// the differences from python3 -c are: the same str hash seed in every call
// of a sandbox (hash randomization across calls is lost; set PYTHONHASHSEED
// to choose it), and the zygote's few imported modules (os, sys, select,
// resource, _socket, _signal) already in sys.modules. When /bin/sh is dash,
// shell code of at most maxShellScript bytes, spare or not, runs as sh -s and
// reads its code from stdin, so $- contains "s"; larger code, and any code
// with another shell (bash reads a script on stdin a byte at a time, so the
// script's commands could read its rest), runs as sh -c and has no spare.
//
// Spares cost memory while a sandbox idles, a forked one most: gVisor breaks
// a forked child's copy-on-write by copying up to 2 MiB around the page
// written. With Agent.LazySpares, Serve starts no spare: a sandbox that no
// call used holds the agent alone, and its first Python call starts python3
// itself, later than taking a spare would. A reset drops the spares in either
// mode but, without LazySpares, a python3 spare that has run nothing, which a
// new agent would have (see Reset); the next call of each language starts
// them again. A sandbox that was reset keeps such a python3 (the reserve)
// beside the zygote's spares for its next reset. What spares save and cost:
// docs/PERFORMANCE.md, "Spares and the zygote".
//
// Once no call came for Agent.SpareIdle, the agent drops the zygote and the
// Python spares that calls started, and keeps what Serve starts, a python3
// spare, and the shell's spare (nothing with LazySpares). An idle sandbox then costs what a new one does:
// after a Python call, the zygote and its forked spare held some 8 MiB more of
// the host's memory than a python3 spare (see shrinkSpares).

// maxZygoteFailures is how many times a zygote may die before the agent
// stops starting new ones and starts python3 for every call.
const maxZygoteFailures = 3

// takeSpare returns the spare of req's language if it suits req, or nil.
// When such a spare is being started, it waits for it (or for ctx): that is
// sooner than starting another process next to it.
func (a *Agent) takeSpare(ctx context.Context, req *wire.Request) *proc {
	if !a.Spares {
		return nil
	}
	for {
		a.mu.Lock()
		if req.Language == wire.LanguagePython {
			a.pythonUsed = true
		}
		p, r := a.spares[req.Language], a.refilling[req.Language]
		switch {
		case p == nil:
		case p.limits != req.Limits || !p.running() || !a.spareUsable(p):
			delete(a.spares, req.Language)
			p.discard()
			p = nil
		case !p.fits(req.Code):
			a.mu.Unlock()
			return nil // kept for the next small snippet
		default:
			delete(a.spares, req.Language)
			a.mu.Unlock()
			return p
		}
		a.mu.Unlock()
		if r == nil || r.limits != req.Limits || req.Language == wire.LanguageShell && len(req.Code) > maxShellScript {
			return nil
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil
		}
	}
}

// StartSpares starts the first Python spare now, as Serve does first (none
// without Spares or with LazySpares), and returns once its process exists.
// A program that has work to do before Serve (flmbox-agent makes its
// listener) calls it first: the interpreter's start is the longest step of a
// new sandbox's first call, and from here it overlaps the rest of the
// agent's start. Without it, the spare's goroutine waits for that work, and
// for whatever Serve starts, on the agent's one P.
func (a *Agent) StartSpares() {
	a.init()
	if a.LazySpares {
		return
	}
	a.refill(wire.LanguagePython, a.SpareLimits)
	a.mu.Lock()
	r := a.refilling[wire.LanguagePython]
	a.mu.Unlock()
	if r != nil {
		<-r.done
	}
}

// errResetting is why a spare did not start: a reset began.
var errResetting = errors.New("a reset began")

// refilling is a spare being started.
type refilling struct {
	limits wire.Limits
	done   chan struct{} // closed once it is a spare, or failed to start
}

// refill starts a spare for lang, with limits, in the background, unless the
// agent has one or is starting one, or a reset waits or runs (it starts its
// own: see Reset).
func (a *Agent) refill(lang string, limits wire.Limits) {
	if !a.Spares || lang == wire.LanguagePython && a.pythonErr != nil || lang == wire.LanguageShell && !a.shellIsDash || a.memoryShort() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.resets.Load() > 0 || a.refilling[lang] != nil || a.spares[lang] != nil {
		return
	}
	if a.refilling == nil {
		a.refilling, a.spares = map[string]*refilling{}, map[string]*proc{}
	}
	r := &refilling{limits: limits, done: make(chan struct{})}
	a.refilling[lang] = r
	// The first Python spare is a python3 of its own, the fastest way to a
	// first result; the zygote starts with the second.
	wait := a.pythonUsed
	go func() {
		var p *proc
		err := errResetting
		if a.resets.Load() == 0 { // else the reset that began drops it
			p, err = a.start(lang, "", limits, wait, false, true)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.refilling, lang)
		close(r.done)
		switch {
		case err != nil:
		case a.closed || a.spares[lang] != nil:
			p.discard()
		default:
			a.spares[lang] = p
			if lang == wire.LanguagePython {
				a.refillReserveLocked()
			}
		}
	}()
}

// reserveKey is the reserve's entry in Agent.refilling, which no language
// names: a reset waits for it as for the spares.
const reserveKey = "reserve"

// refillReserveLocked starts the reserve, a python3 spare that only a reset
// takes, in the background, once a reset has run, unless the agent has one,
// or its Python spare is a python3, or a reset waits or runs; a.mu is held.
// It starts once the Python spare of the next calls is ready, so that
// sandboxes reset over and over (retained, pooled) find one at the reset,
// whose next call then takes a python3 that started long before instead of
// waiting for one to start; other sandboxes never have one.
func (a *Agent) refillReserveLocked() {
	if !a.resetDone || a.LazySpares || a.closed || a.resets.Load() > 0 || a.reserve != nil ||
		a.refilling[reserveKey] != nil || a.pristineSpareLocked() != nil || a.memoryShort() {
		return
	}
	r := &refilling{limits: a.SpareLimits, done: make(chan struct{})}
	a.refilling[reserveKey] = r
	go func() {
		p := a.python3Spare()
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.refilling, reserveKey)
		close(r.done)
		switch {
		case p == nil:
		case a.closed || a.resets.Load() > 0 || a.reserve != nil:
			p.discard()
		default:
			a.reserve = p
		}
	}()
}

// pristineSpareLocked returns the Python spare if it is a python3 that the
// agent started (not a fork of the zygote) with the limits of Serve's
// first spare and still waits for its code; a.mu is held.
func (a *Agent) pristineSpareLocked() *proc {
	p := a.spares[wire.LanguagePython]
	if p == nil || !p.pristine || p.limits != a.SpareLimits || !p.running() {
		return nil
	}
	return p
}

// zygote returns the agent's zygote if it is running; with start, it starts
// one if there is none, unless zygotes keep dying.
func (a *Agent) zygote(start bool) *zygote {
	if !a.Spares {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.zyg != nil && !a.zyg.alive() {
		a.zyg = nil
		a.zygoteFailures++
	}
	if a.zyg == nil && start && !a.closed && a.zygoteFailures < maxZygoteFailures {
		z, err := a.startZygote()
		if err != nil {
			a.zygoteFailures++
			return nil
		}
		a.zyg = z
	}
	return a.zyg
}

// Close kills the agent's spares and its zygote. Run may still be called
// after Close; it then starts a new process for every call.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.dropSparesLocked()
	return nil
}

// dropSparesLocked kills the spares and the zygote; a.mu is held.
func (a *Agent) dropSparesLocked() {
	for lang, p := range a.spares {
		p.discard()
		delete(a.spares, lang)
	}
	if a.reserve != nil {
		a.reserve.discard()
		a.reserve = nil
	}
	if a.zyg != nil {
		a.zyg.close()
		a.zyg = nil
	}
}

// DefaultSpareIdle is Agent.SpareIdle's default: how long the spares that
// calls started outlive the last call.
const DefaultSpareIdle = 30 * time.Second

// idleShrink makes shrinkSpares run once no call came for SpareIdle; each
// call's end sets the timer again.
func (a *Agent) idleShrink() {
	after := cmp.Or(a.SpareIdle, DefaultSpareIdle)
	if !a.Spares || after < 0 {
		return
	}
	a.trimMu.Lock()
	defer a.trimMu.Unlock()
	if a.shrink == nil {
		a.shrink = time.AfterFunc(after, a.shrinkSpares)
		return
	}
	a.shrink.Reset(after)
}

// shrinkSpares drops the zygote and the Python spares that calls started,
// and keeps what Serve starts: the Python spare if it is a python3 the agent
// started (pristine), else the reserve, else a python3 spare it starts now;
// and the shell's spare, a waiting sh that costs some 0.1 MiB and saves the
// next shell call its fork and exec. With LazySpares, nothing. Under gVisor, a Python call leaves a zygote and
// its forked spare, whose copy-on-write gVisor broke by copying up to 2 MiB
// around each page written: an idle sandbox held 28.9 MiB of the host's
// memory after one Python call, 20.8 MiB new (its cgroup, medians of 5). It
// does nothing while a call, a reset, a suspend or a spare's start is under
// way, and tries again SpareIdle later.
func (a *Agent) shrinkSpares() {
	if !a.calls.TryLock() {
		a.idleShrink() // a call, a reset, a sweep or a suspend holds it
		return
	}
	a.mu.Lock()
	if a.closed || a.resets.Load() > 0 || a.running.Load() > 0 || len(a.refilling) > 0 {
		closed := a.closed
		a.mu.Unlock()
		a.calls.Unlock()
		if !closed {
			a.idleShrink() // a spare still starts: try again later
		}
		return
	}
	var keep *proc
	if !a.LazySpares {
		keep = a.pristineSpareLocked()
		if keep == nil && a.reserve != nil && a.reserve.running() && a.reserve.limits == a.SpareLimits {
			keep, a.reserve = a.reserve, nil
		}
	}
	for lang, p := range a.spares {
		if p != keep && (a.LazySpares || lang != wire.LanguageShell) {
			p.discard()
			delete(a.spares, lang)
		}
	}
	if keep != nil && a.spares != nil {
		a.spares[wire.LanguagePython] = keep
	}
	if a.reserve != nil { // not a python3 with the first spare's limits
		a.reserve.discard()
		a.reserve = nil
	}
	if a.zyg != nil {
		a.zyg.close()
		a.zyg = nil
	}
	a.pythonUsed = false // the next Python spare is a python3, as Serve's first
	a.shrinks.Add(1)
	a.mu.Unlock()
	a.calls.Unlock()
	if keep == nil && !a.LazySpares {
		a.refill(wire.LanguagePython, a.SpareLimits)
	}
}
