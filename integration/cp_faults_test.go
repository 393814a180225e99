//go:build integration

package integration

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/sandbox"
)

// TestCpFaults: the fault rows about flmbox cp, in one sandbox whose
// /tmp is 256 MiB. Only regular files, directories and links are copied
// (a FIFO or a device is refused by name, each way); a sparse file of 512 MiB
// stays sparse each way and fits in that /tmp; a copy that fills /tmp fails
// as resource exhausted, saying so, and leaves no partial file; a refused
// copy out leaves nothing on the host; a missing file is not found.
func TestCpFaults(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "s", "--tmp-size", "256MiB")
	host := t.TempDir()
	m, err := sandbox.Open(root, sandbox.WithRunsc(runscPath), sandbox.WithAgent(flmboxAgent))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("special files in", func(t *testing.T) {
		fifo := filepath.Join(host, "fifo")
		if err := unix.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		tree := filepath.Join(host, "tree")
		if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(filepath.Join(tree, "sub", "pipe"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ src, want string }{
			{fifo, fifo + " is a FIFO"},
			{"/dev/null", "/dev/null is a character device"},
			{"/dev/zero", "/dev/zero is a character device"},
			{tree, "tree/sub/pipe is a FIFO"},
		} {
			cpRefused(t, root, nil, tc.want, tc.src, "s:/tmp/")
			cpRefused(t, root, nil, tc.want, tc.src, "s:/tmp/renamed")
		}
		if out := shell(t, root, "s", "ls -A /tmp | tr '\\n' ' '"); out != "" {
			t.Errorf("after the refused copies, /tmp holds %q", out)
		}
	})

	t.Run("special files out", func(t *testing.T) {
		shell(t, root, "s", "mkfifo /tmp/fifo; mkdir -p /tmp/t/sub; echo x > /tmp/t/a; mkfifo /tmp/t/sub/pipe")
		defer shell(t, root, "s", "rm -rf /tmp/fifo /tmp/t")
		out := filepath.Join(host, "out")
		for _, tc := range []struct{ src, want string }{
			{"/tmp/fifo", "/tmp/fifo is a FIFO"},
			{"/dev/null", "/dev/null is a character device"},
			{"/dev/zero", "/dev/zero is a character device"},
			{"/tmp/t", "t/sub/pipe is a FIFO"},
		} {
			cpRefused(t, root, nil, tc.want, "s:"+tc.src, out)
			if _, err := os.Lstat(out); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("cp s:%s %s made %s (%v)", tc.src, out, out, err)
				os.RemoveAll(out)
			}
		}
	})

	t.Run("no space", func(t *testing.T) {
		big := filepath.Join(host, "big")
		f, err := os.Create(big)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(f, rand.NewChaCha8([32]byte{'n', 'o', 's', 'p'}), 300<<20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		defer os.Remove(big)
		res := cp(t, root, nil, big, "s:/tmp/")
		if res.code != 125 || !strings.Contains(res.stderr, "/tmp is full") || !strings.Contains(res.stderr, "--tmp-size") ||
			!strings.Contains(res.stderr, "resource exhausted") || strings.Contains(res.stderr, "invalid argument") {
			t.Errorf("cp of 300 MiB into a /tmp of 256 MiB: exit %d, stderr %q; want 125, /tmp is full, --tmp-size, resource exhausted", res.code, res.stderr)
		}
		if out := shell(t, root, "s", "ls -A /tmp | tr '\\n' ' '; df -k /tmp | awk 'NR==2 {print ($3 < 1024)}'"); out != "1\n" {
			t.Errorf("after the copy that filled /tmp: %q, want /tmp empty and nothing of it kept", out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), cpTimeout)
		defer cancel()
		r, err := os.Open(big)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		// The same through the API: a tar stream of one file of 300 MiB.
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(tarFile(pw, "big", r, 300<<20))
		}()
		err = m.CopyIn(ctx, "s", "/tmp/", pr, sandbox.CopyOptions{})
		if !errdefs.IsResourceExhausted(err) || errdefs.IsInvalidArgument(err) {
			t.Errorf("CopyIn of 300 MiB into a /tmp of 256 MiB: %v, want resource exhausted", err)
		}
		if out := shell(t, root, "s", "ls -A /tmp | tr '\\n' ' '"); out != "" {
			t.Errorf("after CopyIn filled /tmp: %q, want it empty", out)
		}
	})

	// Twice /tmp's size: only a copy that keeps the holes fits.
	t.Run("sparse", func(t *testing.T) {
		const size = 512 << 20
		sparse := filepath.Join(host, "sparse")
		f, err := os.Create(sparse)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte("head"), 0)
		f.WriteAt([]byte("middle"), size/2)
		f.WriteAt([]byte("tail"), size-4)
		f.Close()
		defer os.Remove(sparse)
		mustCp(t, root, nil, "--max-size", "4GiB", sparse, "s:/tmp/")
		check := `import os
st = os.stat("/tmp/sparse")
f = open("/tmp/sparse", "rb")
def at(o, n):
    f.seek(o); return f.read(n).decode()
vfs = os.statvfs("/tmp")  # gVisor's st_blocks of a tmpfs file is its size: the pages used are the filesystem's
print(st.st_size, (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize < (8 << 20), at(0, 4), at(%d, 6), at(%d, 4), f.read(1) == b"")
`
		want := fmt.Sprintf("%d True head middle tail True\n", size)
		if res := runIn(t, root, "s", fmt.Sprintf(check, size/2, size-4)); res.code != 0 || res.stdout != want {
			t.Errorf("the sparse file copied in: exit %d, %q, want %q (stderr %q)", res.code, res.stdout, want, res.stderr)
		}
		// Out again: as sparse on the host.
		back := filepath.Join(host, "back")
		mustCp(t, root, nil, "--max-size", "4GiB", "s:/tmp/sparse", back)
		var st unix.Stat_t
		if err := unix.Stat(back, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != size || st.Blocks*512 > 8<<20 {
			t.Errorf("the sparse file copied out: %d bytes, %d allocated; want %d bytes and holes", st.Size, st.Blocks*512, int64(size))
		}
		// Its three pieces, read where they are: the file is not read whole.
		bf, err := os.Open(back)
		if err != nil {
			t.Fatal(err)
		}
		at := func(off int64, n int) string {
			b := make([]byte, n)
			if _, err := bf.ReadAt(b, off); err != nil {
				t.Fatalf("read the sparse file copied out at %d: %v", off, err)
			}
			return string(b)
		}
		if at(0, 4) != "head" || at(size/2, 6) != "middle" || at(size-4, 4) != "tail" {
			t.Errorf("the sparse file copied out has other contents")
		}
		bf.Close()
		os.Remove(back)
		shell(t, root, "s", "rm -f /tmp/sparse")

		// A sparse file made in the sandbox comes out sparse.
		shell(t, root, "s", fmt.Sprintf("truncate -s %d /tmp/made; printf x >> /tmp/made", size))
		mustCp(t, root, nil, "--max-size", "4GiB", "s:/tmp/made", back)
		if err := unix.Stat(back, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != size+1 || st.Blocks*512 > 8<<20 {
			t.Errorf("the sparse file made in the sandbox, copied out: %d bytes, %d allocated; want %d bytes and holes", st.Size, st.Blocks*512, int64(size+1))
		}
		os.Remove(back)
		shell(t, root, "s", "rm -f /tmp/made")
	})

	t.Run("refused copy out leaves nothing", func(t *testing.T) {
		out := filepath.Join(host, "agent-out")
		res := cp(t, root, nil, "s:/dev/.flmbox", out)
		if res.code != 125 {
			t.Errorf("cp s:/dev/.flmbox %s: exit %d, stderr %q; want 125", out, res.code, res.stderr)
		}
		if _, err := os.Lstat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cp s:/dev/.flmbox %s made %s (%v)", out, out, err)
		}
		into := filepath.Join(host, "into")
		if err := os.Mkdir(into, 0o755); err != nil {
			t.Fatal(err)
		}
		if res := cp(t, root, nil, "s:/dev/.flmbox", into); res.code != 125 {
			t.Errorf("cp s:/dev/.flmbox %s: exit %d, stderr %q; want 125", into, res.code, res.stderr)
		}
		if ents, _ := os.ReadDir(into); len(ents) != 0 {
			t.Errorf("cp s:/dev/.flmbox %s left %v", into, ents)
		}
	})

	t.Run("missing", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), cpTimeout)
		defer cancel()
		rc, err := m.CopyOut(ctx, "s", "/tmp/nosuch", sandbox.CopyOptions{})
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		if !errdefs.IsNotFound(err) {
			t.Errorf("CopyOut of a missing file: %v, want not found", err)
		}
		cpRefused(t, root, nil, "no such file or directory", "s:/tmp/nosuch", filepath.Join(host, "x"))
		cpRefused(t, root, nil, "no such file or directory", filepath.Join(host, "nosuch"), "s:/tmp/")
	})
}

// tarFile writes to w a tar stream of one regular file, name, of size
// bytes read from r.
func tarFile(w io.Writer, name string, r io.Reader, size int64) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: time.Now()}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, r, size); err != nil {
		return err
	}
	return tw.Close()
}
