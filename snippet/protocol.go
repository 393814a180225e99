package snippet

import "github.com/flmbox/flmbox/snippet/wire"

// The protocol's messages and bounds are defined in package wire, which the
// flmbox command uses without the rest of this package; these are the same
// types and values under this package's names.

// ProtocolVersion is wire.ProtocolVersion.
const ProtocolVersion = wire.ProtocolVersion

// Languages of a Request.
const (
	LanguagePython = wire.LanguagePython
	LanguageShell  = wire.LanguageShell
)

// Bounds of a Request (see package wire).
const (
	MaxCodeSize      = wire.MaxCodeSize
	MaxShellCodeSize = wire.MaxShellCodeSize
	MaxTimeout       = wire.MaxTimeout
	DefaultMaxOutput = wire.DefaultMaxOutput
	MaxMaxOutput     = wire.MaxMaxOutput
)

type (
	// Request is wire.Request: one snippet to run.
	Request = wire.Request
	// Limits is wire.Limits: rlimits of a snippet's process.
	Limits = wire.Limits
	// Output is wire.Output: what a snippet wrote to one stream.
	Output = wire.Output
	// Result is wire.Result: the outcome of one snippet.
	Result = wire.Result
)

// errorResult is the answer to a request that could not be run.
func errorResult(err error) *Result {
	return &Result{Version: ProtocolVersion, ExitCode: -1, Error: err.Error()}
}
