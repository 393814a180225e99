package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/rootfs"
)

// prepareImage prewarms the image into the private root from where it
// comes (not measured): the sandboxes run on it, and it tells the index and
// platform manifest digests the loopback registry must serve.
func (r *runner) prepareImage(ctx context.Context) error {
	r.logf("prewarm %s into %s", r.image, r.root)
	store, err := r.m.Images()
	if err != nil {
		return err
	}
	if r.img, err = store.Prewarm(ctx, r.image, nil); err != nil {
		return err
	}
	cfg, err := store.Config(r.img.ManifestDigest)
	if err != nil {
		return err
	}
	r.imageEnv = cfg.Config.Env
	return nil
}

// measurePrewarm copies the image into a loopback registry and measures,
// alternating, cold `flmbox prewarm` processes (each into a new state root)
// and crane export | tar -x of the same platform image, then, with the
// registry stopped, cache-hit prewarms by index digest. Trees are removed
// only at the end: ext4 is slow to allocate inodes for a while after a large
// removal, which would slow the next round.
func (r *runner) measurePrewarm(ctx context.Context) (Prewarm, error) {
	var rep Prewarm
	reg, err := startRegistry()
	if err != nil {
		return rep, err
	}
	defer reg.close()
	r.logf("prewarm: copy the image into a loopback registry")
	if err := reg.push(ctx, r.image, r.img.IndexDigest, r.img.ManifestDigest); err != nil {
		return rep, err
	}
	r.ref = reg.ref(r.img.IndexDigest)
	var cold, crn []float64
	for i := range r.opts.PrewarmRounds {
		r.logf("prewarm: cold round %d of %d", i+1, r.opts.PrewarmRounds)
		err := alternate(ctx, i, reg.ref(r.img.ManifestDigest), filepath.Join(r.dir, "crane", strconv.Itoa(i)), &crn, func() error {
			d, err := r.timePrewarm(ctx, filepath.Join(r.dir, "cold", strconv.Itoa(i)), false)
			cold = append(cold, ms(d))
			return err
		})
		if err != nil {
			return rep, err
		}
	}
	reg.close()
	r.logf("prewarm: cache hits, registry stopped")
	var hit []float64
	for range max(10, 5*r.opts.PrewarmRounds) {
		d, err := r.timePrewarm(ctx, r.root, true)
		if err != nil {
			return rep, err
		}
		hit = append(hit, ms(d))
	}
	rep.Cold, rep.Hit = summarize(cold), summarize(hit)
	rep.ColdMS, rep.HitMS = rep.Cold.Median, rep.Hit.Median
	if len(crn) > 0 {
		s := summarize(crn)
		rep.CraneTar, rep.CraneTarMS = &s, &s.Median
	}
	return rep, nil
}

// alternate runs round i of a cold prewarm: prewarm, and crane export |
// tar -x of ref into dir if crane is on PATH (its time appended to crn),
// crane first in odd rounds, each followed by a sync so that the next
// does not pay for its writeback.
func alternate(ctx context.Context, i int, ref, dir string, crn *[]float64, prewarm func() error) error {
	steps := []func() error{prewarm}
	if crane, err := exec.LookPath("crane"); err == nil {
		steps = append(steps, func() error {
			d, err := craneTar(ctx, crane, ref, dir)
			*crn = append(*crn, ms(d))
			return err
		})
	}
	if i%2 == 1 {
		slices.Reverse(steps)
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
		unix.Sync()
	}
	return nil
}

// timePrewarm times one `flmbox prewarm --json` process by index digest
// into root, and checks that it made (or, cached, found) the image.
func (r *runner) timePrewarm(ctx context.Context, root string, cached bool) (time.Duration, error) {
	d, out, err := timeCommand(r.flmboxIn(ctx, root, "prewarm", "--json", r.ref))
	if err != nil {
		return d, err
	}
	var res rootfs.Result
	if err := json.Unmarshal(out, &res); err != nil {
		return d, fmt.Errorf("check the output of flmbox prewarm: %w: %q", err, out)
	}
	if res.ManifestDigest != r.img.ManifestDigest || res.Cached != cached {
		return d, fmt.Errorf("check the output of flmbox prewarm: manifest %s, cached %t; want %s, cached %t",
			res.ManifestDigest, res.Cached, r.img.ManifestDigest, cached)
	}
	return d, nil
}

// craneTar times `crane export REF - | tar -x -C DIR` and checks that both
// succeeded and DIR is not empty.
func craneTar(ctx context.Context, crane, ref, dir string) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	export := exec.CommandContext(ctx, crane, "export", ref, "-")
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	var exportErr, untarErr strings.Builder
	export.Stdout, export.Stderr = pw, &exportErr
	untar.Stdin, untar.Stderr = pr, &untarErr
	start := time.Now()
	errT := untar.Start()
	errE := export.Start()
	pw.Close() // the children hold their own ends
	pr.Close()
	if errE == nil {
		errE = export.Wait()
	}
	if errT == nil {
		errT = untar.Wait()
	}
	d := time.Since(start)
	switch {
	case errE != nil:
		return d, commandFailed("crane export "+ref, errE, exportErr.String())
	case errT != nil:
		return d, commandFailed("tar -x -C "+dir, errT, untarErr.String())
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) == 0 {
		return d, fmt.Errorf("check crane export | tar: %s is empty", dir)
	}
	return d, nil
}
