// Package bench measures a flmbox worker the way the reference system was
// measured, and takes every baseline in the same run: a new sandbox's first
// result against raw runsc create + start + exec on a bundle made from
// flmbox's own spec, warm calls against runsc exec in the same sandbox and
// the same command under chroot on the same rootfs, batch throughput with
// one and with all CPUs, cold prewarms against crane export | tar -x from
// the same loopback registry, and the host memory of an idle sandbox against
// a bare runsc container; and `flmbox instance` as Flame runs it (package
// internal/testrig/flamesim): a new instance until its first task's result against
// `flmbox run --image`, warm tasks over gRPC against `flmbox run --sandbox`;
// and a callback's round trip from inside a sandbox to a server in the
// bench's process against the same Python client on the host, on the same
// server's socket. With Options.Density, it also measures density: idle
// sandboxes made one after another, what each costs the host and
// what their count costs each of them, at every tenth of the count and
// against one sandbox alone (density.go).
// It is `flmbox bench`; the command only reads its flags into Options, calls
// Run and prints the Report.
//
// Each flmbox figure is measured twice where both exist: as whole `flmbox`
// processes (the command users run, Options.Flmbox) and through the Go API
// in this process (package sandbox's Manager). Every output is checked;
// figures are medians, warm calls the median of the rounds' medians (p95:
// of the rounds' p95s). Measurements of different kinds alternate, in
// rotating order, so that a drift of the machine falls on all of them.
//
// Run works in a private state root, a new directory bench-XXXX under
// Options.Root: it never touches the sandboxes or the image cache there,
// and removes its directory (sandboxes, runsc containers, mounts and all)
// at the end, also when its context is cancelled. It needs root.
package bench
