package pipcache

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
)

// maxFilenameLen is the longest wheel filename accepted (a file name
// component on Linux).
const maxFilenameLen = 255

// Filename is a parsed wheel filename (the binary distribution format
// specification): {distribution}-{version}(-{build tag})?-{python
// tag}-{abi tag}-{platform tag}.whl.
type Filename struct {
	// Distribution is the name as it appears in the filename (escaped: runs
	// of - _ . are _ in wheels built by current tools).
	Distribution string
	// Version is the version as it appears in the filename.
	Version string
	// Build is the optional build tag; it starts with a digit.
	Build string
	// Python, ABI and Platform are the compatibility tags; each may be a
	// compressed tag set joined with dots (py2.py3).
	Python, ABI, Platform string
}

// Name returns the distribution's normalized name (NormalizeName).
func (f Filename) Name() string { return NormalizeName(f.Distribution) }

// ParseFilename parses and validates a wheel's file name (no directory).
// Every part is limited to letters, digits and the few punctuation marks
// the specification allows, so a valid name is also a safe file name. Its
// errors match errdefs.ErrInvalidArgument.
func ParseFilename(name string) (Filename, error) {
	bad := func(why string) (Filename, error) {
		return Filename{}, fmt.Errorf("wheel filename %q: %s; want NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl: %w", name, why, errdefs.ErrInvalidArgument)
	}
	if len(name) > maxFilenameLen {
		return bad("too long")
	}
	stem, ok := strings.CutSuffix(name, ".whl")
	if !ok {
		return bad("it does not end in .whl")
	}
	parts := strings.Split(stem, "-")
	var f Filename
	switch len(parts) {
	case 5:
		f = Filename{Distribution: parts[0], Version: parts[1], Python: parts[2], ABI: parts[3], Platform: parts[4]}
	case 6:
		f = Filename{Distribution: parts[0], Version: parts[1], Build: parts[2], Python: parts[3], ABI: parts[4], Platform: parts[5]}
	default:
		return bad(fmt.Sprintf("%d dash-separated parts instead of 5 or 6", len(parts)))
	}
	switch {
	case !validDistribution(f.Distribution):
		return bad("the distribution name must be letters, digits, '_' and '.', starting and ending with a letter or digit")
	case !onlyChars(f.Version, "._!+"):
		return bad("the version holds characters a version cannot have")
	case f.Build != "" && (f.Build[0] < '0' || f.Build[0] > '9' || !onlyChars(f.Build, "._")):
		return bad("the build tag must start with a digit")
	case !onlyChars(f.Python, "._") || !onlyChars(f.ABI, "._") || !onlyChars(f.Platform, "._"):
		return bad("a tag holds characters other than letters, digits, '_' and '.'")
	}
	if _, err := NormalizeVersion(f.Version); err != nil {
		return bad(err.Error())
	}
	return f, nil
}

func validDistribution(s string) bool {
	return s != "" && isAlnum(s[0]) && isAlnum(s[len(s)-1]) && onlyChars(s, "._")
}

// onlyChars says whether s is non-empty and holds only ASCII letters,
// digits and bytes of extra.
func onlyChars(s, extra string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && strings.IndexByte(extra, s[i]) < 0 {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// NormalizeName returns a distribution name normalized as PEP 503 says:
// lower case, every run of '-', '_' and '.' replaced by one '-'. Two names
// are the same project if their normalized names are equal.
func NormalizeName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '-' || c == '_' || c == '.':
			if i == 0 || !isSeparator(name[i-1]) {
				b.WriteByte('-')
			}
		case 'A' <= c && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isSeparator(c byte) bool { return c == '-' || c == '_' || c == '.' }
