package snippet

import (
	"testing"
	"time"
)

// TestSuspendWaitsForACallsEnd: a suspend sent right after a call's answer
// meets that call's stray sweep holding the calls' lock; it waits for it
// (no snippet runs), but refuses at once while a snippet runs. Not
// parallel: "at once" is timed.
func TestSuspendWaitsForACallsEnd(t *testing.T) {
	a := &Agent{}
	a.calls.Lock() // a sweep at work
	go func() {
		time.Sleep(50 * time.Millisecond)
		a.calls.Unlock()
	}()
	if !a.lockCalls() {
		t.Fatal("a suspend after a call's end was refused while its sweep ran")
	}
	a.calls.Unlock()

	a.calls.RLock() // a call
	a.running.Add(1)
	start := time.Now()
	if a.lockCalls() {
		t.Fatal("a suspend took the calls' lock while a snippet ran")
	}
	if d := time.Since(start); d >= endingWait {
		t.Errorf("a suspend waited %s for a running snippet; it refuses at once", d)
	}
	a.running.Add(-1)
	a.calls.RUnlock()
}
