package runcmd

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Interrupt is the cause of the context of a command that a signal
// interrupted (see NotifyContext). It matches context.Canceled.
type Interrupt struct {
	Signal syscall.Signal
}

func (i *Interrupt) Error() string { return i.Signal.String() + " signal received" }

// Is makes an Interrupt match context.Canceled, as signal.NotifyContext's
// causes do.
func (i *Interrupt) Is(target error) bool { return target == context.Canceled }

// NotifyContext returns a copy of parent that the first SIGINT or SIGTERM
// cancels with an *Interrupt cause, which says which signal it was. Until
// stop is called, later signals are caught and dropped, so that a second
// Ctrl-C does not kill flmbox before it has removed what it made.
func NotifyContext(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			cancel(&Interrupt{Signal: s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(context.Canceled)
	}
}

// ExitInterrupted is flmbox run's exit status when SIGINT interrupted it;
// SIGTERM gives 143 (see InterruptStatus).
const ExitInterrupted = 128 + int(syscall.SIGINT)

// InterruptStatus is the exit status of a command whose ctx a signal
// cancelled, as a shell reports a process that the signal ended: 128 + the
// signal's number (130 for SIGINT, 143 for SIGTERM); ExitInterrupted if the
// cause is not an *Interrupt.
func InterruptStatus(ctx context.Context) int {
	var i *Interrupt
	if errors.As(context.Cause(ctx), &i) {
		return 128 + int(i.Signal)
	}
	return ExitInterrupted
}

// PrintInterrupted prints what an interrupted call returned, res (nil if
// the agent did not answer the interrupt: with asJSON, an object with
// exit_code -1 and no output stands for it), as Print does, and returns the
// exit status for ctx's signal (InterruptStatus).
func PrintInterrupted(ctx context.Context, stdout, stderr io.Writer, res *Result, asJSON bool) (int, error) {
	if res == nil {
		if !asJSON {
			return InterruptStatus(ctx), nil
		}
		res = &Result{ExitCode: -1, Interrupted: true}
	}
	if _, _, err := Print(stdout, stderr, res, asJSON, 0); err != nil {
		return ExitFlmboxFailed, err
	}
	return InterruptStatus(ctx), nil
}
