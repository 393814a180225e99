package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/flmbox/flmbox/"

// goList returns, for each package patterns name, the packages it imports
// directly (what=Imports) or links (what=Deps).
func goList(t *testing.T, what string, patterns ...string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-f", `{{.ImportPath}} {{join .` + what + ` " "}}`}, patterns...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkgs[f[0]] = f[1:]
	}
	return pkgs
}

// TestFrontsStayAboveSandbox keeps docs/ARCHITECTURE.md's rule: the fronts
// call sandbox, rootfs and pipcache, never what sandbox is made of.
func TestFrontsStayAboveSandbox(t *testing.T) {
	below := []string{"runtime", "snippet", "snippet/wire", "sandbox/record", "egress"}
	for pkg, imports := range goList(t, "Imports", "../flmbox/app", "../../instance", "../../mcpserver", "../../bench", "../flmbox-bench") {
		for _, imp := range imports {
			if name, ok := strings.CutPrefix(imp, module); ok && slices.Contains(below, name) {
				t.Errorf("%s imports %s: a front uses package sandbox's vocabulary instead", pkg, imp)
			}
		}
	}
}

// TestLauncherLinksNoEgress: the flmbox launcher, whose start every warm
// call pays, links no nftables, netlink or DNS code.
func TestLauncherLinksNoEgress(t *testing.T) {
	for pkg, deps := range goList(t, "Deps", "../flmbox") {
		for _, dep := range deps {
			if dep == module+"egress" || strings.Contains(dep, "nftables") || strings.Contains(dep, "miekg/dns") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

// TestShippedBinariesLinkNoTestRig: the binaries a worker installs link no
// registry server, Flame simulator, test image builder or tool server.
func TestShippedBinariesLinkNoTestRig(t *testing.T) {
	for pkg, deps := range goList(t, "Deps", ".", "../flmbox", "../flmbox-agent", "../flmbox-resolver") {
		for _, dep := range deps {
			if strings.HasSuffix(dep, "go-containerregistry/pkg/registry") || strings.HasPrefix(dep, module+"internal/testrig") ||
				dep == module+"bench" {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
