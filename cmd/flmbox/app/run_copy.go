package app

import (
	"fmt"
	"path"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/internal/safetar"
	"github.com/flmbox/flmbox/sandbox"
)

// copiesFrom reads run's --copy HOST_PATH:SANDBOX_PATH flags into the
// copies its call makes before the code runs (sandbox.Request.CopyIn),
// each as flmbox cp HOST_PATH NAME:SANDBOX_PATH makes it (hostTar, at most
// sandbox.DefaultCopyBytes of files, cp's default). HOST_PATH ends at the
// first ':' (as docker's -v reads it); each must exist and be a regular
// file, a directory or a link (safetar.Check), and SANDBOX_PATH
// must be under /tmp, the only place a copy may write: both are checked
// here, before any sandbox is taken.
func copiesFrom(c *cli.Context) ([]sandbox.CopyIn, error) {
	var out []sandbox.CopyIn
	for _, arg := range listFlag(c, "copy") {
		src, dst, ok := strings.Cut(arg, ":")
		switch clean := path.Clean(dst); {
		case !ok || src == "" || dst == "":
			return nil, fmt.Errorf("--copy %q: want HOST_PATH:SANDBOX_PATH, such as ./tools.py:/tmp/tools.py", arg)
		case src == "-":
			return nil, fmt.Errorf("--copy %q: takes a host path; a tar stream on stdin goes in with flmbox cp - NAME:DIR", arg)
		case !strings.HasPrefix(dst, "/") || (clean != "/tmp" && !strings.HasPrefix(clean, "/tmp/")):
			return nil, fmt.Errorf("--copy %q: the path in the sandbox, %q, must be absolute and under /tmp", arg, dst)
		}
		if err := safetar.Check(src); err != nil {
			return nil, fmt.Errorf("--copy %q: %w", arg, err)
		}
		o := sandbox.CopyOptions{MaxBytes: sandbox.DefaultCopyBytes}
		out = append(out, sandbox.CopyIn{Dst: dst, Open: hostTar(src, o.MaxBytes), Options: o})
	}
	return out, nil
}
