package app

import (
	"fmt"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

// callbackLimitFlags are the flags that only apply with --callback.
var callbackLimitFlags = []string{"callback-env", "callback-conns", "callback-bytes", "callback-idle"}

// callbackFrom reads --callback and its limits into the callback of a
// call (nil without --callback). HOST_SOCKET is checked here, before
// anything runs: it must be a socket (sandbox.DialUnix).
func callbackFrom(c *cli.Context) (*sandbox.Callback, error) {
	path := c.String("callback")
	if path == "" {
		if c.IsSet("callback") {
			return nil, fmt.Errorf("--callback: want the path of a Unix socket on the host")
		}
		for _, name := range callbackLimitFlags {
			if c.IsSet(name) {
				return nil, fmt.Errorf("--%s applies with --callback HOST_SOCKET only", name)
			}
		}
		return nil, nil
	}
	cb := &sandbox.Callback{Env: listFlag(c, "callback-env"), MaxConns: c.Int("callback-conns"), Idle: c.Duration("callback-idle")}
	if cb.MaxConns < 1 || cb.MaxConns > sandbox.MaxCallbackConns {
		return nil, fmt.Errorf("--callback-conns %d: want 1 to %d", cb.MaxConns, sandbox.MaxCallbackConns)
	}
	var err error
	if cb.MaxBytes, err = parseSize("--callback-bytes", c.String("callback-bytes")); err != nil {
		return nil, err
	}
	if cb.MaxBytes > sandbox.MaxCallbackBytes {
		return nil, fmt.Errorf("--callback-bytes %s: want at most %s", c.String("callback-bytes"), units.BytesSize(sandbox.MaxCallbackBytes))
	}
	if c.IsSet("callback-idle") && (cb.Idle < time.Millisecond || cb.Idle > sandbox.MaxCallbackIdle) {
		return nil, fmt.Errorf("--callback-idle %s: want 1ms to %s", cb.Idle, sandbox.MaxCallbackIdle)
	}
	if cb.Dial, err = sandbox.DialUnix(path); err != nil {
		return nil, advise(err, "--callback names the Unix socket a server of yours listens on: start it first, or fix the path")
	}
	return cb, nil
}
