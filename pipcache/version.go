package pipcache

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// versionPattern is PEP 440's version grammar, as the packaging library
// writes it (VERSION_PATTERN), anchored and case-insensitive.
var versionPattern = regexp.MustCompile(`(?i)^\s*v?` +
	`(?:(?P<epoch>[0-9]+)!)?` +
	`(?P<release>[0-9]+(?:\.[0-9]+)*)` +
	`(?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?` +
	`(?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?` +
	`(?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?` +
	`(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$`)

// releasePattern is the release segment at the start of a normalized
// version.
var releasePattern = regexp.MustCompile(`^[0-9]+(?:\.[0-9]+)*`)

// maxVersionLen bounds the versions parsed (a regexp over an unbounded
// METADATA line would still be linear, but there is no use for it).
const maxVersionLen = 256

// NormalizeVersion returns v in PEP 440's normal form (what packaging's
// str(Version(v)) prints): "1.0-RC.1" is "1.0rc1", "1.0-1" is "1.0.post1",
// "v01.2" is "1.2". Its errors match errdefs.ErrInvalidArgument.
func NormalizeVersion(v string) (string, error) {
	m := matchVersion(v)
	if m == nil {
		return "", fmt.Errorf("version %q is not a PEP 440 version: %w", v, errdefs.ErrInvalidArgument)
	}
	var b strings.Builder
	if e := number(m["epoch"]); e != "" && e != "0" {
		b.WriteString(e + "!")
	}
	for i, n := range strings.Split(m["release"], ".") {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(number(n))
	}
	if m["pre"] != "" {
		b.WriteString(preLabel(strings.ToLower(m["pre_l"])) + numberOr0(m["pre_n"]))
	}
	if m["post"] != "" {
		b.WriteString(".post" + numberOr0(m["post_n1"]+m["post_n2"]))
	}
	if m["dev"] != "" {
		b.WriteString(".dev" + numberOr0(m["dev_n"]))
	}
	if l := m["local"]; l != "" {
		b.WriteString("+" + strings.Map(func(r rune) rune {
			if r == '-' || r == '_' {
				return '.'
			}
			return r
		}, strings.ToLower(l)))
	}
	return b.String(), nil
}

// versionKey returns the form in which two versions are equal when PEP 440
// says they are: normalized, with trailing zeros of the release dropped
// ("1.0" and "1.0.0" are the same version).
func versionKey(v string) (string, error) {
	n, err := NormalizeVersion(v)
	if err != nil {
		return "", err
	}
	epoch, rest, ok := strings.Cut(n, "!")
	if !ok {
		epoch, rest = "", n
	} else {
		epoch += "!"
	}
	end := len(releasePattern.FindString(rest))
	release := rest[:end]
	for strings.HasSuffix(release, ".0") {
		release = strings.TrimSuffix(release, ".0")
	}
	return epoch + release + rest[end:], nil
}

func matchVersion(v string) map[string]string {
	if len(v) > maxVersionLen {
		return nil
	}
	sub := versionPattern.FindStringSubmatch(v)
	if sub == nil {
		return nil
	}
	m := map[string]string{}
	for i, name := range versionPattern.SubexpNames() {
		if name != "" {
			m[name] = sub[i]
		}
	}
	return m
}

func preLabel(l string) string {
	switch l {
	case "alpha":
		return "a"
	case "beta":
		return "b"
	case "c", "pre", "preview":
		return "rc"
	}
	return l
}

// number drops leading zeros from a string of digits (numbers in versions
// can be longer than any integer type).
func number(s string) string {
	if t := strings.TrimLeft(s, "0"); t != "" {
		return t
	}
	if s == "" {
		return ""
	}
	return "0"
}

func numberOr0(s string) string {
	if s == "" {
		return "0"
	}
	return number(s)
}
