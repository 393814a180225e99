package bench

import (
	"context"
	goruntime "runtime"

	"github.com/flmbox/flmbox/sandbox"
)

// run measures everything, in an order that keeps each part from disturbing
// the next: prewarm first (it fills the private cache the sandboxes run on),
// then allocation, warm calls, flmbox instance and callbacks beside one
// persistent sandbox, copies, suspend, egress (in network namespaces of
// its own), batch throughput, and memory, with no other sandbox of the
// bench running; the density section (Options.Density) last, or alone.
func (r *runner) run(ctx context.Context) (*Report, error) {
	o := r.opts
	rep := &Report{Settings: Settings{Pairs: o.Pairs, Warmup: o.Warmup, Rounds: o.Rounds, Calls: o.Calls, PauseMS: ms(o.Pause),
		PrewarmRounds: o.PrewarmRounds, CPUs: goruntime.NumCPU()}}
	rep.Runsc = Runsc{Path: r.runscInfo.Path, Version: r.runscInfo.Version, Platform: r.runscInfo.DefaultPlatform}
	if err := r.prepareImage(ctx); err != nil {
		return nil, err
	}
	var err error
	if o.DensityOnly {
		// No loopback registry: the sandboxes run the image as given,
		// cached by prepareImage.
		r.ref = r.image
		rep.Settings.DensityOnly = true
		rep.Image = Image{Ref: r.image, IndexDigest: r.img.IndexDigest, ManifestDigest: r.img.ManifestDigest,
			Platform: r.img.Platform, SizeBytes: r.img.SizeBytes}
		if rep.Density, err = r.measureDensity(ctx); err != nil {
			return nil, err
		}
		return rep, nil
	}
	if o.LongOnly {
		// No loopback registry: the sandbox runs the image as given.
		r.ref = r.image
		rep.Settings.LongOnly = true
		rep.Image = Image{Ref: r.image, IndexDigest: r.img.IndexDigest, ManifestDigest: r.img.ManifestDigest,
			Platform: r.img.Platform, SizeBytes: r.img.SizeBytes}
		sb, err := r.m.Create(ctx, r.spec("bench-long"))
		if err != nil {
			return nil, err
		}
		defer sb.Remove(context.WithoutCancel(ctx))
		if rep.Long, err = r.measureLong(ctx, sb); err != nil {
			return nil, err
		}
		return rep, nil
	}
	if rep.Prewarm, err = r.measurePrewarm(ctx); err != nil {
		return nil, err
	}
	if o.BigImage > 0 {
		if rep.Prewarm.Big, err = r.measureBigPrewarm(ctx); err != nil {
			return nil, err
		}
	}
	rep.Image = Image{Ref: r.image, IndexDigest: r.img.IndexDigest, ManifestDigest: r.img.ManifestDigest,
		Platform: r.img.Platform, SizeBytes: r.img.SizeBytes}

	warm, err := r.m.Create(ctx, r.spec("bench-warm"))
	if err != nil {
		return nil, err
	}
	if warm.Platform != "" {
		rep.Runsc.Platform = warm.Platform
	}
	if rep.Allocation, err = r.measureAllocation(ctx); err != nil {
		return nil, err
	}
	if rep.Warm, err = r.measureWarm(ctx, warm); err != nil {
		return nil, err
	}
	if rep.Long, err = r.measureLong(ctx, warm); err != nil {
		return nil, err
	}
	if rep.Instance, err = r.measureInstance(ctx, warm); err != nil {
		return nil, err
	}
	if rep.Callback, err = r.measureCallback(ctx, warm); err != nil {
		return nil, err
	}
	if rep.Records, err = r.measureRecords(ctx, warm); err != nil {
		return nil, err
	}
	if err := warm.Remove(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	if rep.Copy, err = r.measureCopy(ctx); err != nil {
		return nil, err
	}
	if rep.Suspend, err = r.measureSuspend(ctx); err != nil {
		return nil, err
	}
	if rep.Egress, err = r.measureEgress(ctx); err != nil {
		return nil, err
	}
	if rep.Batch, err = r.measureBatch(ctx); err != nil {
		return nil, err
	}
	if rep.Memory, err = r.measureMemory(ctx); err != nil {
		return nil, err
	}
	if rep.Pool, err = r.measurePoolMemory(ctx); err != nil {
		return nil, err
	}
	if o.Density > 0 {
		if rep.Density, err = r.measureDensity(ctx); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// spec is flmbox's defaults for a sandbox of the bench's image (from the
// loopback registry, cached by then), named name ("": a random name).
func (r *runner) spec(name string) sandbox.Spec {
	return sandbox.Spec{Name: name, Image: r.ref}
}
