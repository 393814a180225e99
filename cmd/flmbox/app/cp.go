package app

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/internal/names"
	"github.com/flmbox/flmbox/internal/safetar"
	"github.com/flmbox/flmbox/sandbox"
)

func cpCommand() *cli.Command {
	return &cli.Command{
		Name: "cp",
		Usage: "copy files between a sandbox and the host, as docker cp does: into the sandbox only under /tmp, as its " +
			"user; links are copied as links, never followed",
		ArgsUsage: "SRC NAME:DST | NAME:SRC DST  (- for a tar stream on stdin or stdout)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "max-size", Value: units.BytesSize(sandbox.DefaultCopyBytes), Usage: "the most bytes of files one copy carries"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return fmt.Errorf("cp takes SRC and DST, one of them NAME:PATH in a sandbox; got %q", c.Args().Slice())
			}
			max, err := parseSize("--max-size", c.String("max-size"))
			if err != nil {
				return err
			}
			src, dst := c.Args().Get(0), c.Args().Get(1)
			sname, spath, sIn := splitSandboxPath(src)
			dname, dpath, dIn := splitSandboxPath(dst)
			if sIn == dIn {
				return fmt.Errorf("cp copies between a sandbox and the host: give one of SRC and DST as NAME:PATH (a host path with ':' in it: write it ./PATH)")
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			o := sandbox.CopyOptions{MaxBytes: max}
			if dIn {
				return copyIn(c, m, src, dname, dpath, o)
			}
			return copyOut(c, m, sname, spath, dst, o)
		},
	}
}

// splitSandboxPath splits NAME:PATH; ok is false for a host path (no ':'
// before the first '/', as docker reads it).
func splitSandboxPath(arg string) (name, p string, ok bool) {
	name, p, ok = strings.Cut(arg, ":")
	if !ok || strings.Contains(name, "/") || !names.Valid(name, 64) {
		return "", "", false
	}
	return name, p, true
}

// copyIn copies host path src ("-": a tar stream on stdin) into sandbox
// name at dst.
func copyIn(c *cli.Context, m *sandbox.Manager, src, name, dst string, o sandbox.CopyOptions) error {
	if !strings.HasPrefix(dst, "/") {
		return fmt.Errorf("cp: the path in the sandbox, %q, must be absolute (under /tmp)", dst)
	}
	if src == "-" {
		if !strings.HasSuffix(dst, "/") {
			dst += "/" // a stream goes into a directory
		}
		return m.CopyIn(c.Context, name, dst, c.App.Reader, o)
	}
	if err := safetar.Check(src); err != nil {
		return fmt.Errorf("cp: %w", err) // a FIFO or device is refused by name, a missing path not found
	}
	r, err := hostTar(src, o.MaxBytes)()
	if err != nil {
		return err
	}
	defer r.Close() // ends the archiving if the copy stopped reading
	return m.CopyIn(c.Context, name, dst, r, o)
}

// hostTar returns what opens host path src (a file, a directory, a link)
// as the tar stream flmbox cp sends into a sandbox: one top-level entry
// named by src's base name, links archived as links, never followed, at
// most max bytes of files' contents. Each open archives src anew (run
// --copy's sandbox.CopyIn.Open); closing the stream stops the archiving.
func hostTar(src string, max int64) func() (io.ReadCloser, error) {
	src = filepath.Clean(src)
	return func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(safetar.Archive(pw, src, filepath.Base(src), max)) }()
		return pr, nil
	}
}

// copyOut copies src of sandbox name to host path dst ("-": a tar stream
// on stdout): into dst if it is a directory, else as dst, whose directory
// must exist. Nothing is put in place before the copy has ended well: a
// copy refused or failed part way leaves nothing on the host that was not
// there (safetar's Atomic extraction).
func copyOut(c *cli.Context, m *sandbox.Manager, name, src, dst string, o sandbox.CopyOptions) error {
	if !strings.HasPrefix(src, "/") {
		return fmt.Errorf("cp: the path in the sandbox, %q, must be absolute", src)
	}
	var dir *os.File
	top := ""
	if dst != "-" {
		var err error
		if fi, serr := os.Stat(dst); serr == nil && fi.IsDir() {
			dir, err = os.Open(dst)
		} else if strings.HasSuffix(dst, "/") {
			return fmt.Errorf("cp: %s is not a directory", dst)
		} else {
			dir, err = os.Open(filepath.Dir(filepath.Clean(dst)))
			top = filepath.Base(filepath.Clean(dst))
		}
		if err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		defer dir.Close()
	}
	rc, err := m.CopyOut(c.Context, name, src, o)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dir == nil {
		_, err = io.Copy(c.App.Writer, rc)
		return err
	}
	if err := safetar.Extract(dir, rc, safetar.Options{MaxBytes: o.MaxBytes, Top: top, Atomic: true}); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, rc) // the end of the stream, and how the copy ended
	return err
}
