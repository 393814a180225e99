// Package sandbox owns flmbox's sandboxes: gVisor sandboxes made from cached
// images, each running flmbox's agent as its first process, that run Python
// and shell snippets sent to them.
//
// A Manager, opened on a state root (Open), creates a sandbox from an image
// (Create: pull or find the image in the cache, lease it, start runsc, wait
// for the agent, preinstall pip requirements) and hands it out as a
// *Sandbox, which the caller holds and uses: Call and Reset it, CopyIn and
// CopyOut files, Suspend it to disk and Resume it, Remove it. A *Sandbox is
// bound to the holding it was handed out with (its container and a
// hand-out word in its record): once it was removed and another took its
// name, or released to its pool and handed out again, its methods fail
// with errdefs.ErrNotFound and change nothing, and its agent refuses a
// request of an ended holding (a release's reset ends it under the lock
// calls hold), so a stale handle never reaches the next holder. The
// Manager has the same operations by name, for a caller that holds only
// the name (whichever sandbox holds it now),
// and finds sandboxes (Get, List: records only, changing nothing; Probe:
// liveness, as new descriptions; Sandbox.Info: one handle's sandbox afresh;
// GC: suspend or remove the idle ones; Wait for what calls left in the
// background; Close, when done with the Manager, stops and waits for what it
// started in the background, such as its pools' refills). Acquire and
// Release take sandboxes from a warm pool per shape and give them back reset
// (FillPool, Pools, DrainPools). RunOnce runs one snippet in a fresh sandbox
// and answers before the sandbox is given back; Batch runs up to MaxBatch
// independent snippets, in fresh sandboxes or side by side in one. Reconcile undoes what a killed flmbox
// process left half made, and removes the sandboxes of a process that made
// them for itself (Spec.Ephemeral: RunOnce's, Batch's) once it is gone.
//
// The package speaks its own vocabulary, in types of its own: a Spec
// (checked once, by Normalize), its Limits, Network and Egress, a Request and
// its Result, the languages Python and Shell, and the errors a caller tests
// for (ErrDead, ErrSuspended, ErrInterrupted, *NotRunError, ...); what only
// flmbox's own fronts need is apart, on Plumbing. A caller imports sandbox, and rootfs
// for images or pipcache for wheels, never runtime, snippet or record.
// Doctor checks that a host can run sandboxes.
//
// The package is the only code that reads or writes a sandbox's directory,
// ROOT/sandboxes/NAME (its subpackage record holds the part a warm call
// needs). Every sandbox's record is written before anything a crash could
// leave behind (an image lease, a runsc container), and changed only under
// the directory's lock, so Reconcile can always finish or undo it. A
// sandbox's states:
//
//	creating ──▶ running ──▶ removing ──▶ (gone)
//	    │          ├──▶ dead (its gVisor processes died; only Remove)
//	    │          ├──▶ unresponsive (its agent does not answer a ping:
//	    │          │     stopped or starved; checked, not recorded, and it
//	    │          │     may come back)
//	    │          ├──▶ pooled ──▶ running (Release parks it reset in the
//	    │          │     pool of its shape; Acquire takes it)
//	    │          └──▶ suspending ──▶ suspended ──▶ resuming ──▶ running
//	    │                (Suspend, Resume; a step that fails goes back)
//	    └──▶ (gone: a failed Create removes what it made; a killed one is
//	          left to Reconcile)
//
// Errors carry github.com/containerd/errdefs kinds (not found, already
// exists, invalid argument, failed precondition, unavailable) and say what
// failed; what a person should do about them is for the front end to say.
//
// Files under /tmp survive between calls of a sandbox; every call runs in a
// new process. See docs/ARCHITECTURE.md for what a sandbox is made of.
package sandbox
