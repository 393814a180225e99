package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// cpBytes is the size of the file that flmbox cp carries in the bench.
const cpBytes = 100 << 20

// measureCopy times whole `flmbox cp` processes carrying a directory with
// one 100 MiB file of random bytes into a sandbox's /tmp and back out to
// the host, against `tar -c | tar -x` of the same directory on the host,
// in rounds of the three, Pairs of them after one that is not measured.
func (r *runner) measureCopy(ctx context.Context) (Copy, error) {
	rep := Copy{Bytes: cpBytes}
	r.logf("cp: 100 MiB in and out of a sandbox, and tar | tar on the host")
	src := filepath.Join(r.dir, "cp", "data")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(filepath.Join(r.dir, "cp"))
	f, err := os.Create(filepath.Join(src, "blob"))
	if err != nil {
		return rep, err
	}
	_, err = io.CopyN(f, rand.Reader, cpBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, err
	}
	sb, err := r.m.Create(ctx, r.spec("bench-cp"))
	if err != nil {
		return rep, err
	}
	defer sb.Remove(context.WithoutCancel(ctx))
	var in, out, host []float64
	for i := -1; i < r.opts.Pairs; i++ {
		dst := filepath.Join(r.dir, "cp", fmt.Sprintf("out%d", i+1))
		tarDst := filepath.Join(r.dir, "cp", fmt.Sprintf("tar%d", i+1))
		din, err := timed(r.flmbox(ctx, "cp", src, sb.Name+":/tmp/data"))
		if err != nil {
			return rep, err
		}
		dout, err := timed(r.flmbox(ctx, "cp", sb.Name+":/tmp/data", dst))
		if err != nil {
			return rep, err
		}
		if fi, err := os.Stat(filepath.Join(dst, "blob")); err != nil || fi.Size() != cpBytes {
			return rep, fmt.Errorf("cp: the file copied out is not whole: %v", err)
		}
		if err := os.MkdirAll(tarDst, 0o700); err != nil {
			return rep, err
		}
		tarCmd := exec.CommandContext(ctx, "/bin/sh", "-c", `tar -C "$1" -cf - data | tar -C "$2" -xf -`, "sh", filepath.Dir(src), tarDst)
		dhost, err := timed(tarCmd)
		if err != nil {
			return rep, err
		}
		os.RemoveAll(dst)
		os.RemoveAll(tarDst)
		if _, err := timed(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", "shell", "-c", "rm -rf /tmp/data")); err != nil {
			return rep, err
		}
		if i >= 0 {
			in, out, host = append(in, ms(din)), append(out, ms(dout)), append(host, ms(dhost))
		}
	}
	rep.InMS, rep.OutMS, rep.HostTarMS = summarize(in), summarize(out), summarize(host)
	return rep, nil
}

// timed runs cmd and returns how long it took.
func timed(cmd *exec.Cmd) (time.Duration, error) {
	d, _, err := timeCommand(cmd)
	return d, err
}
