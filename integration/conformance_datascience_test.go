//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/testrig/testimage"
)

// The data-science part of the conformance suite: numpy's and
// pandas' own tests, run by pytest, and a data-science agent's workloads
// (workloads.py), in the test image's variant with Debian's numpy, pandas,
// scipy, scikit-learn, matplotlib, OpenBLAS and pytest
// (testimage.Options.DataScience).

// dataScienceFull are the data-science modules of the full list.
var dataScienceFull = []testModule{
	// test_zeros_big makes arrays of 30M elements of each type, up to
	// 960 MiB (clongdouble): with flmbox's default 512 MiB, both sides
	// were killed there, and 95 % of the module did not run.
	{name: "numpy.core.tests.test_multiarray", suite: pytest, memory: 2 << 30},
	{name: "numpy.core.tests.test_umath", suite: pytest},
	{name: "numpy.core.tests.test_memmap", suite: pytest},
	// TestSavezLoad.test_big_arrays saves a 2 GiB np.empty array to /tmp:
	// the pages it reads, never written, gVisor counts as used (MemAvailable
	// falls by 2 GiB; the host's cgroup does not see them), and flmbox's
	// memory watch killed the run there with the default 512 MiB, where
	// bare runsc's ran on (ENOSPC in /tmp, on both sides). 3 GiB keeps the
	// module away from the limit (docs/CONFORMANCE.md, "What it found").
	{name: "numpy.lib.tests.test_io", suite: pytest, memory: 3 << 30},
	{name: "numpy.linalg.tests.test_linalg", suite: pytest},
	// TestRandomDist.test_dirichlet_moderately_small_alpha makes 20M
	// samples of 3 (480 MB): over the default 512 MiB with the
	// interpreter's own, where flmbox kills it as --memory says and bare
	// runsc's cgroup allows flmbox's headroom for gVisor on top.
	{name: "numpy.random.tests.test_generator_mt19937", suite: pytest, memory: 1 << 30},
	{name: "pandas.tests.groupby.test_groupby", suite: pytest},
	{name: "pandas.tests.io.test_pickle", suite: pytest},
	{name: "pandas.tests.frame.test_constructors", suite: pytest},
	{name: "pandas.tests.window.test_rolling", suite: pytest},
	{name: "scipy.optimize.tests.test_optimize", suite: pytest},
	{name: "workloads", suite: workloads},
}

// dataScienceShort are the data-science modules of the short list, about
// 20 seconds with the variant's prewarm: a quick numpy module whose tests
// write and map files in /tmp, and the workloads whose Pythons start
// others (multiprocessing's spawn and forkserver), draw or use BLAS;
// sklearn_gridsearch_loky, the slowest, in the full list.
var dataScienceShort = []testModule{
	{name: "numpy.core.tests.test_memmap", suite: pytest},
	{name: "workloads", suite: workloads, match: []string{"multiprocessing_spawn_pool", "multiprocessing_forkserver_pool", "matplotlib_savefig", "openblas_svd"}},
}

// pytestName is the dotted name of a test file of a library of the
// DataScience variant.
var pytestName = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*\.test_[a-z0-9_]+$`)

// pytestFile is the test file of m, a pytest module, relative to the
// directory of Debian's Python packages: its tests' node ids start with it.
func (m testModule) pytestFile() string { return strings.ReplaceAll(m.name, ".", "/") + ".py" }

// distPackages is the directory of Debian's Python packages in the image,
// pytest's --rootdir.
var distPackages = "/" + testimage.DistPackagesDir

// pytestScript is the shell script both sides run: pytest_outcomes.py on
// m's test file, or only on the tests ids when there are some, from /tmp
// (hypothesis keeps its examples in .hypothesis there; the tree is
// read-only), without pytest's cache.
func (c *conformance) pytestScript(m testModule, ids []string) string {
	args := []string{"-p", "no:cacheprovider", "-q", "--rootdir", distPackages}
	if len(ids) > 0 && !slices.Contains(ids, m.name) {
		for _, id := range ids {
			args = append(args, path.Join(distPackages, id))
		}
	} else {
		if len(m.match) > 0 {
			args = append(args, "-k", strings.Join(m.match, " or "))
		}
		args = append(args, path.Join(distPackages, m.pytestFile()))
	}
	var b strings.Builder
	b.WriteString("cat > /tmp/flmbox-conformance.py <<'FLMBOX_EOF'\n" + c.scripts[pytest] + "FLMBOX_EOF\n")
	b.WriteString("cat > /tmp/flmbox-conformance.args <<'FLMBOX_EOF'\n" + strings.Join(args, "\n") + "\nFLMBOX_EOF\n")
	b.WriteString("cd /tmp\n")
	fmt.Fprintf(&b, "python3 /tmp/flmbox-conformance.py %d /tmp/flmbox-conformance.args 3>&1 >/tmp/flmbox-conformance.log 2>&1\n", int(m.runTimeout().Seconds()))
	fmt.Fprintf(&b, "printf '%%s%%s\\n' '%s' \"$?\"\n", exitMarker)
	b.WriteString("tail -n 40 /tmp/flmbox-conformance.log\n")
	return b.String()
}

// workloadsProgram is the Python program both sides run: workloads.py, for
// the workloads of m (all if m.match is empty) or only those of the tests
// ids when there are some.
func (c *conformance) workloadsProgram(m testModule, ids []string) string {
	only := m.match
	if len(ids) > 0 && !slices.Contains(ids, m.name) {
		only = nil
		for _, id := range ids {
			only = append(only, strings.TrimPrefix(id, m.name+"."))
		}
	}
	names, _ := json.Marshal(only) // a JSON list of strings is a Python list
	if only == nil {
		names = []byte("[]")
	}
	return fmt.Sprintf("ONLY = %s\nTIMEOUT = %d\n", names, int(m.runTimeout().Seconds())) + c.scripts[workloads]
}

// TestConformanceDataScienceScripts checks what both sides are given to run
// a pytest module and the workloads, whole, in part, and again for some of
// their tests.
func TestConformanceDataScienceScripts(t *testing.T) {
	t.Parallel()
	c := &conformance{scripts: map[suite]string{pytest: "PYTEST\n", workloads: "WORKLOADS\n"}}
	m := testModule{name: "numpy.core.tests.test_x", suite: pytest}
	args := func(script string) []string {
		_, rest, _ := strings.Cut(script, "cat > /tmp/flmbox-conformance.args <<'FLMBOX_EOF'\n")
		list, _, _ := strings.Cut(rest, "FLMBOX_EOF\n")
		return strings.Fields(list)
	}
	base := []string{"-p", "no:cacheprovider", "-q", "--rootdir", "/usr/lib/python3/dist-packages"}
	file := "/usr/lib/python3/dist-packages/numpy/core/tests/test_x.py"
	tests := []struct {
		name string
		m    testModule
		ids  []string
		want []string
	}{
		{"whole", m, nil, append(slices.Clone(base), file)},
		{"in part", testModule{name: m.name, suite: pytest, match: []string{"TestA", "b"}}, nil, append(slices.Clone(base), "-k", "TestA", "or", "b", file)},
		{"some tests", m, []string{"numpy/core/tests/test_x.py::TestA::test_a[1-2]", "numpy/core/tests/test_x.py::test_b"},
			append(slices.Clone(base), file+"::TestA::test_a[1-2]", file+"::test_b")},
		{"after a killed run", m, []string{m.name, "numpy/core/tests/test_x.py::test_b"}, append(slices.Clone(base), file)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := c.script(tt.m, tt.ids)
			if s.language != "shell" || !strings.HasPrefix(s.code, "cat > /tmp/flmbox-conformance.py <<'FLMBOX_EOF'\nPYTEST\nFLMBOX_EOF\n") ||
				!strings.Contains(s.code, "\ncd /tmp\npython3 /tmp/flmbox-conformance.py 240 /tmp/flmbox-conformance.args 3>&1 ") {
				t.Fatalf("script %q", s.code)
			}
			if got := args(s.code); !slices.Equal(got, tt.want) {
				t.Errorf("pytest's arguments %q, want %q", got, tt.want)
			}
		})
	}
	if !m.owns("numpy/core/tests/test_x.py::TestA::test_a") || !m.owns(m.name) || !m.owns("numpy/core/tests/test_x.py") || m.owns("numpy/core/tests/test_xy.py::test_a") {
		t.Error("owns: wrong")
	}

	w := testModule{name: "workloads", suite: workloads, match: []string{"a", "b"}}
	for _, tt := range []struct {
		ids  []string
		want string
	}{
		{nil, `ONLY = ["a","b"]`},
		{[]string{"workloads.b"}, `ONLY = ["b"]`},
		{[]string{"workloads"}, `ONLY = ["a","b"]`},
	} {
		if s := c.script(w, tt.ids); s.language != "python" || s.code != tt.want+"\nTIMEOUT = 240\nWORKLOADS\n" {
			t.Errorf("workloads %q: %q %q", tt.ids, s.language, s.code)
		}
	}
	if s := c.script(testModule{name: "workloads", suite: workloads}, nil); !strings.HasPrefix(s.code, "ONLY = []\n") {
		t.Errorf("all workloads: %q", s.code)
	}
}
