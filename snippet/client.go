package snippet

import (
	"context"
	"net"

	"github.com/flmbox/flmbox/snippet/wire"
)

// DialAgent connects to the agent's socket at path, refusing anything but a
// socket there as wire.Dial does (errdefs.ErrPermissionDenied), until ctx is
// done.
func DialAgent(ctx context.Context, path string) (net.Conn, error) {
	f, err := wire.Dial(ctx, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return net.FileConn(f)
}

// Call runs req through the agent listening on the Unix socket socketPath
// and returns its result; see wire.Call.
func Call(ctx context.Context, socketPath string, req *Request) (*Result, error) {
	return wire.Call(ctx, socketPath, req)
}
