package pipcache

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseFilename(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Filename
		err  string
	}{
		{in: "hello-1.0-py3-none-any.whl", want: Filename{Distribution: "hello", Version: "1.0", Python: "py3", ABI: "none", Platform: "any"}},
		{in: "Hello_World-2.0rc1-1b-py2.py3-none-any.whl", want: Filename{Distribution: "Hello_World", Version: "2.0rc1", Build: "1b", Python: "py2.py3", ABI: "none", Platform: "any"}},
		{in: "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", want: Filename{Distribution: "numpy", Version: "1.26.4", Python: "cp311", ABI: "cp311", Platform: "manylinux_2_17_x86_64.manylinux2014_x86_64"}},
		{in: "torch-2.1.0+cpu-cp311-cp311-linux_x86_64.whl", want: Filename{Distribution: "torch", Version: "2.1.0+cpu", Python: "cp311", ABI: "cp311", Platform: "linux_x86_64"}},
		{in: "hello-1.0-py3-none-any.zip", err: "does not end in .whl"},
		{in: "hello-1.0.whl", err: "2 dash-separated parts"},
		{in: "a-b-c-d-e-f-g.whl", err: "7 dash-separated parts"},
		{in: "../x-1.0-py3-none-any.whl", err: "distribution name"},
		{in: "x/y-1.0-py3-none-any.whl", err: "distribution name"},
		{in: "_x-1.0-py3-none-any.whl", err: "distribution name"},
		{in: "hello-1.0-x-py3-none-any.whl", err: "build tag"},
		{in: "hello-one-py3-none-any.whl", err: "not a PEP 440 version"},
		{in: "hello-1.0-py3-none-any/x.whl", err: "tag"},
		{in: "hello-1.0-py3-none-" + strings.Repeat("a", 250) + ".whl", err: "too long"},
		{in: "hello-1.0-py3-none-\x00.whl", err: "tag"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseFilename(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("got %+v, %v; want an invalid-argument error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestNormalizeName(t *testing.T) {
	for in, want := range map[string]string{
		"Hello":             "hello",
		"hello_world":       "hello-world",
		"Hello.World":       "hello-world",
		"hello__-.World":    "hello-world",
		"zope.interface":    "zope-interface",
		"typing-extensions": "typing-extensions",
		"-x_":               "-x-",
	} {
		if got := NormalizeName(in); got != want {
			t.Errorf("NormalizeName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNormalizeVersion(t *testing.T) {
	for in, want := range map[string]string{
		"1.0":                            "1.0",
		"v1.0":                           "1.0",
		"01.002":                         "1.2",
		"1.0-RC.1":                       "1.0rc1",
		"1.0alpha2":                      "1.0a2",
		"1.0beta":                        "1.0b0",
		"1.0c3":                          "1.0rc3",
		"1.0-1":                          "1.0.post1",
		"1.0_rev2":                       "1.0.post2",
		"1.0.post":                       "1.0.post0",
		"1.0-dev3":                       "1.0.dev3",
		"1!2.0":                          "1!2.0",
		"0!2.0":                          "2.0",
		"1.0+Ubuntu-1_2":                 "1.0+ubuntu.1.2",
		" 1.0 ":                          "1.0",
		"123456789012345678901234567890": "123456789012345678901234567890",
	} {
		got, err := NormalizeVersion(in)
		if err != nil || got != want {
			t.Errorf("NormalizeVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "one", "1.0-", "1..0", "1.0+", "1.0+a..b", strings.Repeat("1", 300)} {
		if _, err := NormalizeVersion(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("NormalizeVersion(%q): %v, want an invalid-argument error", bad, err)
		}
	}
	for _, same := range [][2]string{{"1.0", "1"}, {"1.0.0", "1.0"}, {"1.0.0rc1", "1rc1"}, {"2.0-1", "2.post1"}} {
		if !sameVersion(same[0], same[1]) {
			t.Errorf("%s and %s should be the same version", same[0], same[1])
		}
	}
	for _, diff := range [][2]string{{"1.0", "1.0.1"}, {"1.0", "1.0rc1"}, {"1!1.0", "1.0"}, {"1.10", "1.1"}, {"10", "1"}} {
		if sameVersion(diff[0], diff[1]) {
			t.Errorf("%s and %s should differ", diff[0], diff[1])
		}
	}
}

func TestParseSelector(t *testing.T) {
	w := &Wheel{Name: "hello-world", Version: "1.0"}
	for in, match := range map[string]bool{
		"hello-world":        true,
		"Hello_World":        true,
		"hello.world==1.0.0": true,
		"hello-world == 1.0": true,
		"hello-world==1.1":   false,
		"hello":              false,
	} {
		s, err := ParseSelector(in)
		if err != nil || s.Matches(w) != match {
			t.Errorf("ParseSelector(%q) = %+v, %v; matches %v, want %v", in, s, err, s.Matches(w), match)
		}
	}
	for _, bad := range []string{"", "==1.0", "hello==", "hello>=1.0", "../x", "hello==x y"} {
		if _, err := ParseSelector(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseSelector(%q): %v, want an invalid-argument error", bad, err)
		}
	}
}
