package snippet

import "github.com/flmbox/flmbox/snippet/wire"

// errorResult is the answer to a request that could not be run.
func errorResult(err error) *wire.Result {
	return &wire.Result{Version: wire.ProtocolVersion, ExitCode: -1, Error: err.Error()}
}
