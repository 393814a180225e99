package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/rootfs"
)

// bigImageLayers is how many layers the big image has.
const bigImageLayers = 4

// BigPrewarm is the big image's prewarm section (Options.BigImage): an
// image the bench builds, of bigImageLayers layers of files of
// pseudo-random text (gzip compresses them to about half), cold prewarms
// against crane export | tar -x of it, and the most the disk's used bytes
// grew during a cold prewarm beside what the image unpacks to.
type BigPrewarm struct {
	Bytes    int64  `json:"bytes"`
	Layers   int    `json:"layers"`
	Cold     Stats  `json:"cold_stats"`
	CraneTar *Stats `json:"crane_tar_stats"`
	// PeakDiskBytes is the most the file system's used bytes grew above
	// where they were when a cold prewarm started, sampled every 20 ms
	// (the largest of the rounds).
	PeakDiskBytes int64 `json:"peak_disk_bytes"`
}

// measureBigPrewarm builds the big image, pushes it into a loopback
// registry and measures cold prewarms of it beside crane export | tar -x,
// alternating; every tree is removed after its round, so that the disk
// holds one at a time.
func (r *runner) measureBigPrewarm(ctx context.Context) (*BigPrewarm, error) {
	rep := &BigPrewarm{Bytes: r.opts.BigImage, Layers: bigImageLayers}
	reg, err := startRegistry()
	if err != nil {
		return nil, err
	}
	defer reg.close()
	r.logf("big image: build %s of %d layers and push it", fmtBytes(r.opts.BigImage), bigImageLayers)
	ref, err := pushBigImage(ctx, reg.repo, r.opts.BigImage)
	if err != nil {
		return nil, err
	}
	var cold, crn []float64
	rounds := min(r.opts.PrewarmRounds, 3)
	for i := range rounds {
		r.logf("big image: cold round %d of %d", i+1, rounds)
		dir := filepath.Join(r.dir, "big", strconv.Itoa(i))
		err := alternate(ctx, i, ref, filepath.Join(r.dir, "big-crane", strconv.Itoa(i)), &crn, func() error {
			d, peak, err := r.timeBigPrewarm(ctx, dir, ref)
			cold, rep.PeakDiskBytes = append(cold, ms(d)), max(rep.PeakDiskBytes, peak)
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, d := range []string{dir, filepath.Join(r.dir, "big-crane", strconv.Itoa(i))} {
			if err := os.RemoveAll(d); err != nil {
				return nil, err
			}
		}
		unix.Sync()
	}
	rep.Cold = summarize(cold)
	if len(crn) > 0 {
		s := summarize(crn)
		rep.CraneTar = &s
	}
	return rep, nil
}

// timeBigPrewarm times one cold `flmbox prewarm --json` of ref into root,
// sampling the file system's used bytes meanwhile; it returns the time and
// the most they grew.
func (r *runner) timeBigPrewarm(ctx context.Context, root, ref string) (time.Duration, int64, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return 0, 0, err
	}
	used := func() int64 {
		var st unix.Statfs_t
		if unix.Statfs(root, &st) != nil {
			return 0
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	base := used()
	var peak int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, used()-base)
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	d, out, err := timeCommand(r.flmboxIn(ctx, root, "prewarm", "--json", ref))
	close(stop)
	wg.Wait()
	peak = max(peak, used()-base) // what the last tick missed
	if err != nil {
		return d, peak, err
	}
	var res rootfs.Result
	if err := json.Unmarshal(out, &res); err != nil || res.Cached {
		return d, peak, fmt.Errorf("check the output of flmbox prewarm: %v: %q", err, out)
	}
	return d, peak, nil
}

// pushBigImage builds an image of bigImageLayers layers holding size
// bytes of files in all (1 MiB to 8 MiB each, pseudo-random text from a
// fixed seed) and pushes it to repo; it returns its reference by digest.
func pushBigImage(ctx context.Context, repo name.Repository, size int64) (string, error) {
	img := mutate.MediaType(empty.Image, "application/vnd.oci.image.manifest.v1+json")
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", rootfs.HostPlatform().Architecture
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for l := range bigImageLayers {
		gz, err := bigLayer(rng, l, size/bigImageLayers)
		if err != nil {
			return "", err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(gz)), nil })
		if err != nil {
			return "", err
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return "", err
		}
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	ref := repo.Digest(d.String())
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push the big image: %w", err)
	}
	return ref.Name(), nil
}

// bigLayer is layer l of the big image, gzipped (fastest level): files of
// 1 to 8 MiB of pseudo-random text, n bytes of them in all, in
// directories of 16.
func bigLayer(rng *rand.Rand, l int, n int64) ([]byte, error) {
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 \n"
	buf := make([]byte, 8<<20)
	for i := 0; n > 0; i++ {
		size := min(n, int64(1+rng.IntN(8))<<20)
		n -= size
		if i%16 == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("data/%d/%d/", l, i/16), Mode: 0o755}); err != nil {
				return nil, err
			}
		}
		b := buf[:size]
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("data/%d/%d/%d.txt", l, i/16, i), Mode: 0o644, Size: size}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// fmtBytes is n in binary units.
func fmtBytes(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }
