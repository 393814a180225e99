//go:build integration

package integration

import (
	"archive/tar"
	"encoding/json"
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestImagesRefusedEarly: an image whose /tmp cannot take the sandbox's
// tmpfs (a file, a dangling symlink) is refused when it is prewarmed,
// saying why, and nothing of it is left; a sandbox of another platform
// than the worker's is refused before anything is fetched.
func TestImagesRefusedEarly(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []layerEntry
		says    string
	}{
		{"a file", []layerEntry{{hdr: tar.Header{Name: ".wh.tmp"}}, {hdr: tar.Header{Name: "tmp", Mode: 0o644}, body: []byte("x")}},
			"the image has a regular file at /tmp, where it needs a directory"},
		{"a dangling symlink", []layerEntry{{hdr: tar.Header{Name: ".wh.tmp"}}, {hdr: tar.Header{Name: "tmp", Typeflag: tar.TypeSymlink, Linkname: "/nowhere"}}},
			"/tmp"},
	} {
		ref, _ := pushImage(t, reg, "tmp-"+strings.ReplaceAll(tc.name, " ", "-"), tc.entries, nil)
		res := flmbox(t, root, "prewarm", ref)
		if res.code != 125 || !strings.Contains(res.stderr, tc.says) || strings.Count(strings.TrimSpace(res.stderr), "\n") > 0 {
			t.Errorf("/tmp %s: prewarm exit %d, stderr %q; want one line saying %q", tc.name, res.code, res.stderr, tc.says)
		}
	}
	assertNoEntries(t, root)

	for _, p := range []string{"linux/arm64", "linux/arm/v7"} {
		res := flmbox(t, root, "sandbox", "create", "--image", reg.digestRef(), "--platform", p, "--name", "arm")
		if res.code != 125 || !strings.Contains(res.stderr, "this worker runs linux/amd64; the image asked for is "+p) {
			t.Errorf("a sandbox of %s: exit %d, stderr %q", p, res.code, res.stderr)
		}
	}
	if ents := readDirOrEmpty(t, root+"/images/rootfs"); len(ents) != 0 {
		t.Errorf("the refused create fetched %v", ents)
	}
}

// TestImageWithoutPath: an image whose config sets no environment gets
// docker's PATH, so its Python is found as its shell's commands are.
func TestImageWithoutPath(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	ref, _ := pushImage(t, reg, "no-env", nil, func(c *v1.Config) { c.Env = nil })
	res := flmbox(t, root, "run", "--image", ref, "-c", "import os; print(os.environ['PATH'])")
	if res.code != 0 || res.stdout != "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" {
		t.Fatalf("python in an image without Env: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}
}

// TestMovedTag: a tag moved at the registry is followed as the pull policy
// says: --pull missing (the default) keeps the image cached for it,
// always takes the new one, and never keeps the last resolution.
func TestMovedTag(t *testing.T) {
	t.Parallel()
	reg := ownRegistry(t)
	root := t.TempDir()
	tag := reg.host + "/" + repo + "-derived:moving"
	first, _ := pushImage(t, reg, "moving", []layerEntry{{hdr: tar.Header{Name: "v.txt", Mode: 0o644}, body: []byte("1")}}, nil)
	one := prewarmJSON(t, root, tag)
	if !strings.HasSuffix(first, one.IndexDigest) {
		t.Fatalf("the tag led to %s, want %s", one.IndexDigest, first)
	}
	second, _ := pushImage(t, reg, "moving", []layerEntry{{hdr: tar.Header{Name: "v.txt", Mode: 0o644}, body: []byte("2")}}, nil)
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, first},
		{[]string{"--pull", "missing"}, first},
		{[]string{"--pull", "always"}, second},
		{[]string{"--pull", "never"}, second},
		{nil, second},
	} {
		res := prewarmJSON(t, root, append(tc.flags, tag)...)
		if !strings.HasSuffix(tc.want, res.IndexDigest) {
			t.Errorf("prewarm %v of a moved tag: %s, want %s", tc.flags, res.IndexDigest, tc.want)
		}
	}
}

// TestImageWorkdir: the image's WORKDIR is the snippets' working
// directory where they may enter it, as a docker container starts there;
// /tmp where they may not. A file snippet still runs from its own place.
func TestImageWorkdir(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	open, _ := pushImage(t, reg, "workdir", []layerEntry{
		{hdr: tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "app/data.txt", Mode: 0o644}, body: []byte("data\n")},
	}, func(c *v1.Config) { c.WorkingDir = "/app" })
	closed, _ := pushImage(t, reg, "workdir-closed", []layerEntry{
		{hdr: tar.Header{Name: "secret/", Typeflag: tar.TypeDir, Mode: 0o700}},
	}, func(c *v1.Config) { c.WorkingDir = "/secret" })
	code := "import os; print(os.getcwd()); print(open('data.txt').read() if os.path.exists('data.txt') else '-')"
	if res := flmbox(t, root, "run", "--image", open, "-c", code); res.code != 0 || res.stdout != "/app\ndata\n\n" {
		t.Errorf("WORKDIR /app: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}
	if res := flmbox(t, root, "--debug", "run", "--image", closed, "-c", code); res.code != 0 || res.stdout != "/tmp\n-\n" ||
		!strings.Contains(res.stderr, "WORKDIR /secret is not the snippets' working directory") {
		t.Errorf("WORKDIR /secret, closed: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}
	file := t.TempDir() + "/main.py"
	if err := os.WriteFile(file, []byte("import os, sys\nprint(os.getcwd(), os.path.basename(sys.argv[0]))\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := flmbox(t, root, "run", "--image", open, file); res.code != 0 || res.stdout != "/app main.py\n" {
		t.Errorf("a file snippet with WORKDIR /app: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}
}

// TestImageUser: an image's USER is not honoured (the snippets run as
// 65534:65534, as every sandbox's do), and prewarm says so.
func TestImageUser(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	ref, _ := pushImage(t, reg, "user", nil, func(c *v1.Config) { c.User = "1000:1000" })
	var got struct {
		ImageUser string `json:"image_user"`
	}
	if err := json.Unmarshal([]byte(mustFlmbox(t, root, "prewarm", "--json", ref)), &got); err != nil || got.ImageUser != "1000:1000" {
		t.Errorf("prewarm --json: image_user %q, %v; want the image's 1000:1000", got.ImageUser, err)
	}
	if out := mustFlmbox(t, root, "prewarm", ref); !strings.Contains(out, "image user:      1000:1000 (not honoured: snippets run as 65534:65534)") {
		t.Errorf("prewarm does not say the image's USER is not honoured:\n%s", out)
	}
	if res := flmbox(t, root, "run", "--image", ref, "--language", "shell", "-c", "id -u; id -g"); res.code != 0 || res.stdout != "65534\n65534\n" {
		t.Errorf("a snippet of an image with USER 1000: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}
}

// TestMissingProgramExits127: a snippet whose program is not in the image
// (its shell, its Python) fails as a shell's "command not found" does,
// with status 127 and one line naming what is missing; the other language
// still runs.
func TestMissingProgramExits127(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	noShell, _ := pushImage(t, reg, "no-shell", []layerEntry{{hdr: tar.Header{Name: "usr/bin/.wh.sh"}}}, nil)
	noPython, _ := pushImage(t, reg, "no-python", []layerEntry{{hdr: tar.Header{Name: "usr/bin/.wh.python3"}}}, nil)
	for _, tc := range []struct {
		image, language, says string
	}{
		{noShell, "shell", "the image has no /bin/sh"},
		{noPython, "python", "the image has no Python"},
	} {
		res := flmbox(t, root, "run", "--image", tc.image, "--language", tc.language, "-c", "print(1)")
		if res.code != 127 || !strings.Contains(res.stderr, tc.says) || strings.Count(res.stderr, "\n") != 1 {
			t.Errorf("%s without its program: exit %d, stderr %q; want 127 and one line saying %q", tc.language, res.code, res.stderr, tc.says)
		}
	}
	if res := flmbox(t, root, "run", "--image", noShell, "-c", "print(6*7)"); res.code != 0 || res.stdout != "42\n" {
		t.Errorf("python in an image without /bin/sh: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}
}

// TestResolvConfSymlink: an image whose /etc/resolv.conf is a symlink
// (systemd's stub) gets the sandbox's resolver configuration through its
// link, not none: with --network host, the host's.
func TestResolvConfSymlink(t *testing.T) {
	t.Parallel()
	host, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		t.Skipf("the host has no /etc/resolv.conf: %v", err)
	}
	reg := startRegistry(t)
	root := t.TempDir()
	ref, _ := pushImage(t, reg, "resolv-link", []layerEntry{
		{hdr: tar.Header{Name: "etc/.wh.resolv.conf"}},
		{hdr: tar.Header{Name: "etc/resolv.conf", Typeflag: tar.TypeSymlink, Linkname: "../run/systemd/resolve/stub-resolv.conf"}},
	}, nil)
	res := flmbox(t, root, "run", "--image", ref, "--network", "host", "--language", "shell", "-c", "readlink /etc/resolv.conf; cat /etc/resolv.conf")
	if want := "../run/systemd/resolve/stub-resolv.conf\n" + string(host); res.code != 0 || res.stdout != want {
		t.Errorf("--network host with a symlinked /etc/resolv.conf: exit %d, stdout %q, stderr %s; want %q", res.code, res.stdout, res.stderr, want)
	}
}
