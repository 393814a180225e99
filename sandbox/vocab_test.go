package sandbox

import (
	"testing"

	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// TestVocabularyIsTheLayersBelow: the constants and states sandbox says in
// its own words are the values the agent's protocol and the records use.
func TestVocabularyIsTheLayersBelow(t *testing.T) {
	for _, c := range []struct {
		name       string
		ours, them any
	}{
		{"Python", Python, wire.LanguagePython},
		{"Shell", Shell, wire.LanguageShell},
		{"MaxTimeout", MaxTimeout, wire.MaxTimeout},
		{"DefaultMaxOutput", int64(DefaultMaxOutput), int64(wire.DefaultMaxOutput)},
		{"MaxCodeSize", int64(MaxCodeSize), int64(wire.MaxCodeSize)},
		{"MaxStdinSize", int64(MaxStdinSize), int64(wire.MaxStdinSize)},
		{"DefaultCopyBytes", int64(DefaultCopyBytes), int64(wire.DefaultCopyBytes)},
		{"MaxCopyBytes", int64(MaxCopyBytes), int64(wire.MaxCopyBytes)},
		{"DefaultCallbackConns", int64(DefaultCallbackConns), int64(wire.DefaultCallbackConns)},
		{"DefaultCallbackBytes", int64(DefaultCallbackBytes), int64(wire.DefaultCallbackBytes)},
		{"MaxCallbackConns", int64(MaxCallbackConns), int64(wire.MaxCallbackConns)},
		{"MaxCallbackBytes", int64(MaxCallbackBytes), int64(wire.MaxCallbackBytes)},
		{"MaxCallbackIdle", MaxCallbackIdle, wire.MaxCallbackIdle},
		{"CallbackSocketEnv", CallbackSocketEnv, wire.CallbackSocketEnv},
		{"StateCreating", string(StateCreating), string(record.Creating)},
		{"StateRunning", string(StateRunning), string(record.Running)},
		{"StateRemoving", string(StateRemoving), string(record.Removing)},
		{"StateSuspended", string(StateSuspended), string(record.Suspended)},
		{"StateSuspending", string(StateSuspending), string(record.Suspending)},
		{"StateResuming", string(StateResuming), string(record.Resuming)},
	} {
		if c.ours != c.them {
			t.Errorf("%s is %v, the layer below's %v", c.name, c.ours, c.them)
		}
	}
}
