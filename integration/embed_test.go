//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// TestEmbeddedDemos builds testdata/embed, a program outside cmd/ that
// embeds flmbox through its public packages only, and runs make demo's two
// demos with it against the real runsc and the test image: the same results
// as the CLI prints, and nothing left behind.
func TestEmbeddedDemos(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Public packages and the standard library only: what any Go program
	// outside this module could import.
	list, err := exec.CommandContext(ctx, "go", "list", "-f", `{{join .Imports "\n"}}`, "./testdata/embed").Output()
	if err != nil {
		t.Fatalf("go list ./testdata/embed: %v", err)
	}
	for _, imp := range strings.Fields(string(list)) {
		first, _, _ := strings.Cut(imp, "/")
		if strings.Contains(first, ".") && imp != "github.com/flmbox/flmbox/sandbox" && imp != "github.com/flmbox/flmbox/snippet/wire" {
			t.Errorf("the embedding program imports %s", imp)
		}
	}
	bin := filepath.Join(t.TempDir(), "embed")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./testdata/embed")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ./testdata/embed: %v\n%s", err, out)
	}

	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	cmd := exec.CommandContext(ctx, bin, "-root", root, "-runsc", runscPath, "-agent", flmboxAgent,
		"-image", reg.digestRef(), "-demo", "../demo")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("embed: %v\nstdout: %s\nstderr: %s", err, stdout.Bytes(), stderr.Bytes())
	}
	if stderr.Len() != 0 {
		t.Errorf("embed wrote to stderr: %s", stderr.Bytes())
	}

	// Demo 1: the sandbox's name, then what each of its three calls printed.
	lines := strings.SplitN(stdout.String(), "\n", 5)
	if len(lines) != 5 {
		t.Fatalf("embed printed %q", stdout.String())
	}
	if lines[0] != "demo" || lines[2] != "Linux" {
		t.Errorf("demo 1 printed %q", lines[:4])
	}
	for _, i := range []int{1, 3} {
		var summary map[string]int
		if err := json.Unmarshal([]byte(lines[i]), &summary); err != nil || len(summary) != 3 ||
			summary["rows"] != 4 || summary["revenue"] != 450 || summary["profit"] != 160 {
			t.Errorf("demo 1's summary (line %d): %q: %v", i+1, lines[i], err)
		}
	}

	// Demo 2: the four results in input order, the fourth a ValueError.
	var results []batchElement
	if err := json.Unmarshal([]byte(lines[4]), &results); err != nil || len(results) != 4 || !strings.HasSuffix(lines[4], "]\n") {
		t.Fatalf("demo 2 printed %q: %v", lines[4], err)
	}
	for i, want := range []string{"450.0 160.0\n", "405.0 115.0\n", "360.0 70.0\n"} {
		if r := results[i]; r.ExitCode != 0 || r.Stdout != want || r.Stderr != "" || r.TimedOut == nil || *r.TimedOut {
			t.Errorf("demo 2, result %d: %+v", i, r)
		}
	}
	if r := results[3]; r.ExitCode != 1 || r.Stdout != "" || !strings.Contains(r.Stderr, "ValueError: discount must be between 0 and 1") {
		t.Errorf("demo 2, result 3: %+v", r)
	}

	// Both demos removed their sandboxes, which released the image (looked
	// at before anything reconciles).
	if ls := leases(t, root); len(ls) != 0 {
		t.Errorf("leases left: %+v", ls)
	}
	if ents, err := os.ReadDir(stateroot.Sandboxes(root)); err != nil || len(ents) != 0 {
		t.Errorf("sandbox directories left: %v %v", ents, err)
	}

	// The CLI prints the same for make demo's commands.
	var cli strings.Builder
	cli.WriteString(mustFlmbox(t, root, "sandbox", "create", "--name", "demo", "--image", reg.digestRef()))
	cli.WriteString(mustFlmbox(t, root, "run", "--sandbox", "demo", "--language", "shell", "-c",
		`mkdir -p /tmp/demo && printf "region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n" > /tmp/demo/sales.csv`))
	cli.WriteString(mustFlmbox(t, root, "run", "--sandbox", "demo", "../demo/demo1.py"))
	cli.WriteString(mustFlmbox(t, root, "run", "--sandbox", "demo", "--language", "shell", "-c", "cat /tmp/demo/summary.json; echo"))
	mustFlmbox(t, root, "sandbox", "rm", "demo")
	cli.WriteString(mustFlmbox(t, root, "run", "--batch", "../demo/demo2.json", "--image", reg.digestRef()))
	// Durations differ from run to run.
	duration := regexp.MustCompile(`"duration_ms":[0-9.e+-]+`)
	got, want := duration.ReplaceAllString(stdout.String(), `"duration_ms":D`), duration.ReplaceAllString(cli.String(), `"duration_ms":D`)
	if got != want || !strings.Contains(got, `"duration_ms":D`) {
		t.Errorf("the CLI printed\n%s\nthe embedding program\n%s", cli.String(), stdout.String())
	}
}
