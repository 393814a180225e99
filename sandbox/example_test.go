package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox"
)

// The example's state root (image cache and sandboxes), the image its
// sandboxes run (pulled into the cache on first use; an OCI layout on disk
// works too: oci-layout:PATH@sha256:...) and the Manager's options. The
// package's tests set them to a Debian-based Python test image.
var (
	root    = "/var/lib/flmbox"
	image   = "python:3.12-slim@sha256:<index digest>"
	options []sandbox.Option
)

// A persistent sandbox takes three calls that share its /tmp (each runs in a
// new process), then a batch runs four snippets in clean sandboxes, results
// in input order: a failing snippet never discards the others.
func Example() {
	ctx := context.Background()
	m, err := sandbox.Open(root, options...)
	if err != nil {
		log.Fatal(err)
	}
	sb, err := m.Create(ctx, sandbox.Spec{Image: image})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Remove(ctx)

	for _, req := range []sandbox.Request{
		{Language: sandbox.Shell, Code: `mkdir -p /tmp/demo && printf 'region,revenue,cost\neast,120,75\nwest,80,55\n' > /tmp/demo/sales.csv`},
		{Code: `import csv, json
rows = list(csv.DictReader(open("/tmp/demo/sales.csv")))
revenue = sum(int(r["revenue"]) for r in rows)
summary = {"rows": len(rows), "revenue": revenue, "profit": revenue - sum(int(r["cost"]) for r in rows)}
json.dump(summary, open("/tmp/demo/summary.json", "w"))`},
		{Language: sandbox.Shell, Code: "cat /tmp/demo/summary.json"},
	} {
		res, err := sb.Call(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("exit %d, stdout %q\n", res.ExitCode, res.Stdout.Data)
	}

	var batch []sandbox.Request
	for _, discount := range []string{"0.0", "0.1", "0.2", "1.2"} {
		batch = append(batch, sandbox.Request{Code: "discount = " + discount + `
if not 0 <= discount <= 1:
    raise ValueError("discount must be between 0 and 1")
print(round(450 * (1 - discount), 2))`})
	}
	results, err := m.Batch(ctx, sandbox.Target{Spec: &sandbox.Spec{Image: image}}, batch, 2)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Err != nil:
			fmt.Println("flmbox failed:", r.Err)
		case r.Result.ExitCode != 0:
			lines := strings.Split(strings.TrimSpace(string(r.Result.Stderr.Data)), "\n")
			fmt.Printf("exit %d, stderr ends %q\n", r.Result.ExitCode, lines[len(lines)-1])
		default:
			fmt.Printf("exit 0, stdout %q\n", r.Result.Stdout.Data)
		}
	}
	// Output:
	// exit 0, stdout ""
	// exit 0, stdout ""
	// exit 0, stdout "{\"rows\": 2, \"revenue\": 200, \"profit\": 70}"
	// exit 0, stdout "450.0\n"
	// exit 0, stdout "405.0\n"
	// exit 0, stdout "360.0\n"
	// exit 1, stderr ends "ValueError: discount must be between 0 and 1"
}

// A snippet in a sandbox without a network calls a tool that this program
// serves in process: Callback.Dial makes the host's end of each connection
// the snippet makes to $FLMBOX_CALLBACK_SOCKET (here, one end of a pipe
// whose other end this program answers on).
func ExampleCallback() {
	ctx := context.Background()
	m, err := sandbox.Open(root, options...)
	if err != nil {
		log.Fatal(err)
	}
	sb, err := m.Create(ctx, sandbox.Spec{Image: image})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Remove(ctx)

	tool := func(conn net.Conn) { // answers one line: the word count of the request
		defer conn.Close()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		fmt.Fprintf(conn, "%d words\n", len(strings.Fields(line)))
	}
	res, err := sb.Call(ctx, sandbox.Request{
		Code: `import os, socket
for text in ["the quick brown fox", "jumps"]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["FLMBOX_CALLBACK_SOCKET"])
    s.sendall(text.encode() + b"\n")
    print(s.makefile().readline(), end="")`,
		Callback: &sandbox.Callback{Dial: func(ctx context.Context) (net.Conn, error) {
			mine, theirs := net.Pipe()
			go tool(mine)
			return theirs, nil
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d, stdout %q, %d connections\n", res.ExitCode, res.Stdout.Data, res.Callbacks.Connections)
	// Output:
	// exit 0, stdout "4 words\n1 words\n", 2 connections
}

// An egress sandbox reaches the package index and one API, and nothing
// else: not the host, not the cloud's metadata service, not the private
// network. What it was refused is counted on its handle.
func ExampleEgress() {
	ctx := context.Background()
	m, err := sandbox.Open(root, options...)
	if err != nil {
		log.Fatal(err)
	}
	var allow []sandbox.EgressRule
	for _, s := range []string{"pypi.org", "files.pythonhosted.org", "api.example.com:443"} {
		r, err := sandbox.ParseEgressRule(s)
		if err != nil {
			log.Fatal(err)
		}
		allow = append(allow, r)
	}
	sb, err := m.Create(ctx, sandbox.Spec{Image: image, Network: sandbox.NetworkEgress, Egress: sandbox.Egress{Allow: allow}})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Remove(ctx)
	res, err := sb.Call(ctx, sandbox.Request{Code: `
import urllib.request
try:
    urllib.request.urlopen("http://169.254.169.254/", timeout=5)
except OSError as e:
    print("refused:", e.reason)`})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout.Data)
	if sb, err = m.Get(ctx, sb.Name); err != nil {
		log.Fatal(err)
	}
	for _, r := range sb.Egress.Refused {
		fmt.Println(r.Destination, r.Port, r.Protocol, r.Count)
	}
}

// RunOnce runs one snippet in a clean sandbox (from the pool of its spec's
// shape, or new) and answers as soon as the snippet ends; the sandbox is
// reset and given back in the background, which Close waits for. A snippet
// whose interpreter the image lacks is an error, not a result: nothing ran.
func ExampleManager_RunOnce() {
	ctx := context.Background()
	m, err := sandbox.Open(root, options...)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close(ctx)
	spec := sandbox.Spec{Image: image}
	res, err := m.RunOnce(ctx, spec, sandbox.Request{Code: "print(6 * 7)"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d, stdout %q\n", res.ExitCode, res.Stdout.Data)

	_, err = m.RunOnce(ctx, spec, sandbox.Request{Code: "print(1)", Interpreter: "3.98"})
	fmt.Println(errors.Is(err, sandbox.ErrNoInterpreter), errdefs.IsFailedPrecondition(err))
	// Output:
	// exit 0, stdout "42\n"
	// true true
}
