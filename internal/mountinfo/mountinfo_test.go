package mountinfo

import (
	"slices"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a/b`: "/a/b", `/a\040b`: "/a b", `/t\011x\134y`: "/t\tx\\y", `/end\04`: `/end\04`,
		`/var/a\040b\134c`: `/var/a b\c`} {
		if got := Unescape(in); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	mps, err := Under(t.TempDir())
	if err != nil || len(mps) != 0 {
		t.Errorf("mounts under a new temp dir: %q, %v", mps, err)
	}
	mps, err = Under("/")
	if err != nil || !slices.Contains(mps, "/") || mps[len(mps)-1] != "/" {
		t.Errorf("mounts under /: %q, %v; want / among them, last", mps, err)
	}
}

func TestParse(t *testing.T) {
	got := Parse("30 25 0:26 /docker/c1 /sys/fs/cgroup/cpu\\040x rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n" +
		"short line\n" +
		"31 25 0:27 / /mnt rw\n")
	want := []Mount{{Root: "/docker/c1", Point: "/sys/fs/cgroup/cpu x", Type: "cgroup", SuperOptions: "rw,cpu,cpuacct"}, {Root: "/", Point: "/mnt"}}
	if !slices.Equal(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
}
