//go:build !amd64

package egress

import (
	"fmt"
	"runtime"
)

// confineParser fails on an architecture this package has no system call
// list for: the DNS part is not run unconfined.
func confineParser() error {
	return fmt.Errorf("no seccomp filter for %s: the DNS part runs on amd64 only", runtime.GOARCH)
}
