package runcmd

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime/debug"
)

// buildSettings are the build settings by which two binaries of one build
// must agree: the toolchain, the source (its VCS state, and the Makefile's
// -ldflags, which stamp a hash of the source), and how it was compiled.
var buildSettings = []string{"-ldflags", "-tags", "-trimpath", "CGO_ENABLED", "GOOS", "GOARCH",
	"vcs.revision", "vcs.time", "vcs.modified"}

// SameBuild fails unless the binary at path was built by the same build as
// this one. flmbox checks flmbox-core so, and flmbox-core checks flmbox-bench:
// they share their code (the record and client of a sandbox, run's flags,
// the output), and two binaries of two builds could disagree on any of it.
func SameBuild(path string) error {
	self, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("read this binary's build information")
	}
	other, err := readBuildInfo(path)
	if err != nil {
		return fmt.Errorf("read %s's build information: %w", path, err)
	}
	if d := buildDiff(self, other); d != "" {
		return fmt.Errorf("%s is not of the same build as this flmbox (%s)", path, d)
	}
	return nil
}

// buildInfoMagic starts the build information the Go linker writes into
// every binary (its .go.buildinfo section).
var buildInfoMagic = []byte("\xff Go buildinf:")

// readBuildInfo reads the build information of the Go binary (ELF, 64-bit,
// little-endian: the binaries this command is installed with) at path, as
// debug/buildinfo.ReadFile does for the binaries of Go 1.18 and later: it
// finds the .go.buildinfo section from the section headers, and reads the
// strings inline after its 32-byte header. Not debug/buildinfo itself: it
// brings the ELF, Mach-O, PE, DWARF and zstd readers into this binary, whose
// every warm call then started 0.8 ms later (300 interleaved calls each);
// and not a scan of the file, which cost 25 ms per handover.
func readBuildInfo(path string) (*debug.BuildInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec, err := elfSection(f, ".go.buildinfo")
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(sec, buildInfoMagic) || len(sec) < 32 || sec[15]&2 == 0 {
		return nil, fmt.Errorf("no Go build information of Go 1.18 or later")
	}
	rest := sec[32:]
	var strs [2]string
	for k := range strs {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)-w) {
			return nil, fmt.Errorf("damaged Go build information")
		}
		strs[k], rest = string(rest[w:w+int(n)]), rest[w+int(n):]
	}
	mod := strs[1]
	if len(mod) >= 33 && mod[len(mod)-17] == '\n' {
		mod = mod[16 : len(mod)-16] // the linker's sentinels around it
	}
	bi, err := debug.ParseBuildInfo(mod)
	if err != nil {
		return nil, err
	}
	bi.GoVersion = strs[0]
	return bi, nil
}

// elfSection returns the contents of the section called name of the ELF64
// little-endian file f (at most 1 MiB of it).
func elfSection(f *os.File, name string) ([]byte, error) {
	le := binary.LittleEndian
	hdr := make([]byte, 64)
	if _, err := f.ReadAt(hdr, 0); err != nil || !bytes.HasPrefix(hdr, []byte("\x7fELF\x02\x01")) {
		return nil, fmt.Errorf("not a 64-bit little-endian ELF file")
	}
	shoff, shentsize, shnum, shstrndx := int64(le.Uint64(hdr[0x28:])), int64(le.Uint16(hdr[0x3a:])), int64(le.Uint16(hdr[0x3c:])), int64(le.Uint16(hdr[0x3e:]))
	if shentsize < 64 || shnum == 0 || shnum > 4096 || shstrndx >= shnum {
		return nil, fmt.Errorf("damaged ELF section headers")
	}
	shdrs := make([]byte, shentsize*shnum)
	if _, err := f.ReadAt(shdrs, shoff); err != nil {
		return nil, fmt.Errorf("read ELF section headers: %w", err)
	}
	read := func(i int64, max uint64) ([]byte, error) {
		h := shdrs[i*shentsize:]
		off, size := le.Uint64(h[0x18:]), le.Uint64(h[0x20:])
		buf := make([]byte, min(size, max))
		_, err := f.ReadAt(buf, int64(off))
		return buf, err
	}
	names, err := read(shstrndx, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("read ELF section names: %w", err)
	}
	for i := range shnum {
		at := uint64(le.Uint32(shdrs[i*shentsize:]))
		if at < uint64(len(names)) && bytes.HasPrefix(names[at:], append([]byte(name), 0)) {
			return read(i, 1<<20)
		}
	}
	return nil, fmt.Errorf("no %s section", name)
}

// buildDiff names the first build setting by which a and b differ, or "".
func buildDiff(a, b *debug.BuildInfo) string {
	if a.GoVersion != b.GoVersion {
		return fmt.Sprintf("Go %s, not %s", b.GoVersion, a.GoVersion)
	}
	if a.Main.Path != b.Main.Path || a.Main.Version != b.Main.Version {
		return fmt.Sprintf("module %s@%s, not %s@%s", b.Main.Path, b.Main.Version, a.Main.Path, a.Main.Version)
	}
	for _, k := range buildSettings {
		if va, vb := setting(a, k), setting(b, k); va != vb {
			return fmt.Sprintf("%s %q, not %q", k, vb, va)
		}
	}
	return ""
}

func setting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}
