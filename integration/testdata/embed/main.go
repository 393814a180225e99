// Command embed is a Go program outside cmd/ that embeds flmbox: it runs
// make demo's two demos through package sandbox alone, without the flmbox
// command line, and prints what the CLI prints for them. The integration
// tests build and run it (embed_test.go).
//
//	embed -root DIR -runsc RUNSC -agent FLMBOX-AGENT -image IMAGE [-demo DIR]
//
// Demo 1: three calls in one persistent sandbox named demo (a shell call
// writes a CSV under /tmp, demo1.py summarizes it into a JSON file, a shell
// call prints that file), then the sandbox is removed. Demo 2: the batch of
// demo2.json, each snippet in a clean sandbox, printed as flmbox run --batch
// prints it: one JSON array in input order.
//
// It lives in the integration tests' testdata so that go build ./... and go
// vet ./... leave it alone: it is a test's fixture, not a command to install.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

func main() {
	root := flag.String("root", "", "flmbox's state root")
	runsc := flag.String("runsc", "", "the runsc binary (default: runsc on PATH)")
	agent := flag.String("agent", "", "the flmbox-agent binary (default: next to this program)")
	image := flag.String("image", "", "the image the sandboxes run")
	demo := flag.String("demo", "demo", "the directory of demo1.py and demo2.json")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *root, *runsc, *agent, *image, *demo, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "embed: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root, runsc, agent, image, demo string, stdout, stderr io.Writer) error {
	if image == "" {
		return errors.New("no image: give -image")
	}
	var opts []sandbox.Option
	if runsc != "" {
		opts = append(opts, sandbox.WithRunsc(runsc))
	}
	if agent != "" {
		opts = append(opts, sandbox.WithAgent(agent))
	}
	opts = append(opts, sandbox.WithWarnf(func(f string, a ...any) { fmt.Fprintf(stderr, "embed: warning: "+f+"\n", a...) }))
	m, err := sandbox.Open(root, opts...)
	if err != nil {
		return err
	}
	if err := demo1(ctx, m, image, filepath.Join(demo, "demo1.py"), stdout, stderr); err != nil {
		return fmt.Errorf("demo 1: %w", err)
	}
	if err := demo2(ctx, m, image, filepath.Join(demo, "demo2.json"), stdout); err != nil {
		return fmt.Errorf("demo 2: %w", err)
	}
	return nil
}

// demo1 makes the persistent sandbox demo, runs the demo's three calls in
// it as flmbox run --sandbox demo does, and removes it.
func demo1(ctx context.Context, m *sandbox.Manager, image, program string, stdout, stderr io.Writer) (err error) {
	code, err := os.ReadFile(program)
	if err != nil {
		return err
	}
	if err := m.Remove(ctx, "demo"); err != nil {
		return err
	}
	sb, err := m.Create(ctx, sandbox.Spec{Name: "demo", Image: image})
	if err != nil {
		return err
	}
	defer func() {
		if rerr := sb.Remove(context.WithoutCancel(ctx)); err == nil {
			err = rerr
		}
	}()
	fmt.Fprintln(stdout, sb.Name)
	for _, req := range []sandbox.Request{
		{Language: sandbox.Shell, Code: `mkdir -p /tmp/demo && printf "region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n" > /tmp/demo/sales.csv`},
		{Language: sandbox.Python, Code: string(code)},
		{Language: sandbox.Shell, Code: "cat /tmp/demo/summary.json; echo"},
	} {
		res, err := sb.Call(ctx, req)
		if err != nil {
			return err
		}
		stdout.Write(res.Stdout.Data)
		stderr.Write(res.Stderr.Data)
		switch {
		case res.TimedOut:
			return fmt.Errorf("the snippet timed out after %s", sandbox.DefaultTimeout)
		case res.ExitCode != 0:
			return fmt.Errorf("the snippet exited with status %d", res.ExitCode)
		}
	}
	return nil
}

// batchInput is demo2.json: codes sharing a language and a timeout.
type batchInput struct {
	Language string   `json:"language"`
	Timeout  float64  `json:"timeout"` // seconds
	Codes    []string `json:"codes"`
}

// batchElement is one element of flmbox run --batch's output (the demo's
// output is UTF-8: no base64 fields).
type batchElement struct {
	ExitCode    int     `json:"exit_code"`
	Stdout      string  `json:"stdout"`
	Stderr      string  `json:"stderr"`
	TimedOut    bool    `json:"timed_out"`
	OOMKilled   bool    `json:"oom_killed"`
	Interrupted bool    `json:"interrupted"`
	DurationMS  float64 `json:"duration_ms"`
}

// demo2 runs the batch of file, each snippet in a clean sandbox of image,
// and prints the results as flmbox run --batch does.
func demo2(ctx context.Context, m *sandbox.Manager, image, file string, stdout io.Writer) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var in batchInput
	if err := json.Unmarshal(b, &in); err != nil {
		return fmt.Errorf("parse %s: %w", file, err)
	}
	reqs := make([]sandbox.Request, len(in.Codes))
	for i, code := range in.Codes {
		reqs[i] = sandbox.Request{Language: in.Language, Code: code, Timeout: time.Duration(in.Timeout * float64(time.Second))}
	}
	results, err := m.Batch(ctx, sandbox.Target{Spec: &sandbox.Spec{Image: image}}, reqs, 0)
	if err != nil {
		return err
	}
	out := make([]batchElement, len(results))
	for i, r := range results {
		switch {
		case !r.Ran:
			out[i] = batchElement{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: not run: %v", context.Cause(ctx))}
		case r.Err != nil:
			out[i] = batchElement{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: %v", r.Err)}
		default:
			res := r.Result
			out[i] = batchElement{ExitCode: res.ExitCode, Stdout: text(res.Stdout), Stderr: text(res.Stderr),
				TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, Interrupted: res.Interrupted, DurationMS: float64(res.Duration) / float64(time.Millisecond)}
			if res.TimedOut {
				out[i].Stderr += fmt.Sprintf("flmbox: the snippet timed out after %s and was killed\n", reqs[i].Timeout)
			}
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// text is output as a JSON string carries it.
func text(o sandbox.Output) string { return strings.ToValidUTF8(string(o.Data), "\uFFFD") }
