package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestFlameManifests: the application manifests in deploy/flame are what
// Flame registers (shim Host, a name, flmbox as the command) and their
// arguments are flags that flmbox instance takes: run without the socket
// Flame's executor names, it gets as far as asking for one.
func TestFlameManifests(t *testing.T) {
	files, err := filepath.Glob("../../../deploy/flame/*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("deploy/flame: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Metadata struct{ Name string }
			Spec     struct {
				Shim         string
				Command      string
				Arguments    []string
				Environments map[string]string
			}
		}
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if m.Metadata.Name == "" || m.Spec.Shim != "Host" || filepath.Base(m.Spec.Command) != "flmbox" ||
			len(m.Spec.Arguments) == 0 || m.Spec.Arguments[0] != "instance" {
			t.Errorf("%s: %+v", f, m)
		}
		var stdout, stderr bytes.Buffer
		t.Setenv("FLAME_INSTANCE_ENDPOINT", "")
		args := append([]string{"flmbox", "--root", t.TempDir()}, m.Spec.Arguments...)
		if code := Run(t.Context(), args, &stdout, &stderr); code != 125 || !strings.Contains(stderr.String(), "no socket to serve on") {
			t.Errorf("%s: flmbox %s: exit %d, %s", f, strings.Join(m.Spec.Arguments, " "), code, stderr.String())
		}
	}
}
