package app

import (
	"context"
	"runtime"

	flmboxruntime "github.com/flmbox/flmbox/runtime"
)

// run measures everything, in an order that keeps each part from disturbing
// the next: prewarm first (it fills the private cache the sandboxes run on),
// then allocation and warm calls beside one persistent sandbox, batch
// throughput, and memory last, with no other sandbox of the bench running.
func (b *bench) run(ctx context.Context) (*benchReport, error) {
	o := b.opts
	rep := &benchReport{Settings: settingsReport{Pairs: o.pairs, Warmup: o.warmup, Rounds: o.rounds, Calls: o.calls, PauseMS: ms(o.pause),
		PrewarmRounds: o.prewarmRounds, CPUs: runtime.NumCPU()}}
	info, err := flmboxruntime.InspectRunsc(ctx, b.runsc)
	if err != nil {
		return nil, err
	}
	rep.Runsc = runscReport{Path: b.runsc, Version: info.Version, Platform: info.DefaultPlatform}
	if err := b.prepareImage(ctx); err != nil {
		return nil, err
	}
	if rep.Prewarm, err = b.measurePrewarm(ctx); err != nil {
		return nil, err
	}
	rep.Image = imageReport{Ref: b.image, IndexDigest: b.img.IndexDigest, ManifestDigest: b.img.ManifestDigest,
		Platform: b.img.Platform, SizeBytes: b.img.SizeBytes}

	wo, err := b.sandboxOptions("bench-warm")
	if err != nil {
		return nil, err
	}
	warm, err := createSandbox(ctx, b.cli, wo)
	if err != nil {
		return nil, err
	}
	if warm.Platform != "" {
		rep.Runsc.Platform = warm.Platform
	}
	if rep.Allocation, err = b.measureAllocation(ctx); err != nil {
		return nil, err
	}
	if rep.Warm, err = b.measureWarm(ctx, warm); err != nil {
		return nil, err
	}
	if err := removeSandbox(context.WithoutCancel(ctx), b.cli, warm.Name); err != nil {
		return nil, err
	}
	if rep.Batch, err = b.measureBatch(ctx); err != nil {
		return nil, err
	}
	if rep.Memory, err = b.measureMemory(ctx); err != nil {
		return nil, err
	}
	return rep, nil
}
