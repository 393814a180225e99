package pipcache

import (
	"archive/zip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// Limits bound what validating one wheel reads: a wheel is untrusted input
// (a zip bomb, a huge METADATA). A zero field selects its default.
type Limits struct {
	// MaxWheelBytes is the largest wheel file accepted (default 4 GiB).
	MaxWheelBytes int64
	// MaxUnpackedBytes bounds the sum of the uncompressed sizes of a wheel's
	// entries (default 16 GiB). The sizes are those the zip declares, and
	// reading an entry fails as soon as it yields more than declared.
	MaxUnpackedBytes int64
	// MaxEntries bounds the number of entries of a wheel (default 200,000).
	MaxEntries int
	// MaxMetadataBytes bounds each of the METADATA and WHEEL files, which
	// are read into memory (default 16 MiB).
	MaxMetadataBytes int64
	// MaxRecordBytes bounds the RECORD file, read into memory (default
	// 64 MiB).
	MaxRecordBytes int64
}

// Default limits.
const (
	DefaultMaxWheelBytes    = 4 << 30
	DefaultMaxUnpackedBytes = 16 << 30
	DefaultMaxEntries       = 200_000
	DefaultMaxMetadataBytes = 16 << 20
	DefaultMaxRecordBytes   = 64 << 20
)

// withDefaults returns l with its zero fields set to the defaults.
func (l *Limits) withDefaults() Limits {
	var o Limits
	if l != nil {
		o = *l
	}
	if o.MaxWheelBytes <= 0 {
		o.MaxWheelBytes = DefaultMaxWheelBytes
	}
	if o.MaxUnpackedBytes <= 0 {
		o.MaxUnpackedBytes = DefaultMaxUnpackedBytes
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxMetadataBytes <= 0 {
		o.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = DefaultMaxRecordBytes
	}
	return o
}

// Validate checks that r, size bytes long, is a wheel that may be served
// as filename:
//
//   - filename is a valid wheel filename (ParseFilename);
//   - r is a readable zip within the limits, every entry a regular file or
//     a directory (no symlinks, devices) stored or deflated, with a relative
//     name that stays inside the tree ("..", absolute names, backslashes and
//     NUL bytes are refused), no name twice, no name both a file and a
//     directory;
//   - it holds exactly one NAME-VERSION.dist-info directory, whose METADATA
//     names the same project (normalized names) and version (PEP 440) as the
//     filename, as does the directory's own name; its WHEEL says
//     Wheel-Version 1.x;
//   - its RECORD lists every file with a sha256, sha384 or sha512 hash that
//     matches, and lists nothing that is missing. Every entry is read
//     (which also checks its CRC-32).
//
// It returns the wheel's name (normalized), version (as METADATA says it)
// and size; Digest and Added are left to the caller. Errors about the
// wheel match errdefs.ErrInvalidArgument.
func Validate(ctx context.Context, r io.ReaderAt, size int64, filename string, limits *Limits) (*Wheel, error) {
	l := limits.withDefaults()
	fn, err := ParseFilename(filename)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("wheel %s: %s; rebuild it or download it again: %w", filename, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	if size > l.MaxWheelBytes {
		return nil, bad("%d bytes, more than the limit of %d", size, l.MaxWheelBytes)
	}
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, bad("not a readable zip archive (%v)", err)
	}
	v := &validator{ctx: ctx, zr: zr, limits: l, bad: bad, files: map[string]*zip.File{}}
	if err := v.checkEntries(); err != nil {
		return nil, err
	}
	distInfo, err := v.distInfo(fn)
	if err != nil {
		return nil, err
	}
	version, err := v.checkMetadata(distInfo, fn)
	if err != nil {
		return nil, err
	}
	if err := v.checkWheelFile(distInfo); err != nil {
		return nil, err
	}
	if err := v.checkRecord(distInfo); err != nil {
		return nil, err
	}
	return &Wheel{Filename: filename, Name: fn.Name(), Version: version, Size: size}, nil
}

// validator holds one wheel's validation.
type validator struct {
	ctx    context.Context
	zr     *zip.Reader
	limits Limits
	bad    func(format string, args ...any) error
	files  map[string]*zip.File // regular files by name
}

// checkEntries checks the names, types, count and declared sizes of all
// entries.
func (v *validator) checkEntries() error {
	if len(v.zr.File) > v.limits.MaxEntries {
		return v.bad("%d entries, more than the limit of %d", len(v.zr.File), v.limits.MaxEntries)
	}
	dirs := map[string]bool{}     // explicit and implied directories
	explicit := map[string]bool{} // directory entries
	var unpacked uint64
	for _, f := range v.zr.File {
		if err := checkEntryName(f.Name); err != nil {
			return v.bad("entry %q: %v", f.Name, err)
		}
		name, isDir := strings.CutSuffix(f.Name, "/")
		switch mode := f.Mode(); {
		case mode.IsDir() != isDir:
			return v.bad("entry %q: a directory's name must end in / and only a directory's may", f.Name)
		case !mode.IsDir() && !mode.IsRegular():
			return v.bad("entry %q is a %s; a wheel holds only files and directories", f.Name, typeName(mode))
		}
		if f.Flags&0x1 != 0 {
			return v.bad("entry %q is encrypted", f.Name)
		}
		if f.Method != zip.Store && f.Method != zip.Deflate {
			return v.bad("entry %q uses compression method %d; wheels use stored or deflated entries", f.Name, f.Method)
		}
		if _, dup := v.files[name]; dup || isDir && explicit[name] {
			return v.bad("entry %q appears twice", f.Name)
		}
		unpacked += f.UncompressedSize64
		if unpacked > uint64(v.limits.MaxUnpackedBytes) {
			return v.bad("its entries unpack to more than the limit of %d bytes", v.limits.MaxUnpackedBytes)
		}
		if isDir {
			dirs[name], explicit[name] = true, true
		} else {
			v.files[name] = f
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for name := range v.files {
		if dirs[name] {
			return v.bad("%q is both a file and a directory", name)
		}
	}
	return nil
}

// checkEntryName refuses names that would leave the tree they are unpacked
// into, or that tools read differently.
func checkEntryName(name string) error {
	switch {
	case name == "" || name == "/":
		return errors.New("empty name")
	case len(name) > 4096:
		return errors.New("name longer than 4096 bytes")
	case !utf8.ValidString(name):
		return errors.New("name is not UTF-8")
	case strings.ContainsAny(name, "\\\x00"):
		return errors.New("backslash or NUL in the name")
	case strings.HasPrefix(name, "/"):
		return errors.New("absolute name")
	case len(name) >= 2 && name[1] == ':':
		return errors.New("drive letter in the name")
	}
	for _, c := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		switch {
		case c == "" || c == ".":
			return errors.New("empty or '.' path component")
		case c == "..":
			return errors.New("'..' path component (path traversal)")
		case len(c) > 255:
			return errors.New("path component longer than 255 bytes")
		}
	}
	return nil
}

func typeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeDevice != 0:
		return "device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// distInfo finds the wheel's only .dist-info directory and checks that its
// name matches the filename's.
func (v *validator) distInfo(fn Filename) (string, error) {
	found := map[string]bool{}
	for name := range v.files {
		top, _, _ := strings.Cut(name, "/")
		if strings.HasSuffix(top, ".dist-info") && top != name {
			found[top] = true
		}
	}
	if len(found) != 1 {
		return "", v.bad("%d .dist-info directories; a wheel has exactly one, NAME-VERSION.dist-info", len(found))
	}
	var dir string
	for d := range found {
		dir = d
	}
	name, version, ok := strings.Cut(strings.TrimSuffix(dir, ".dist-info"), "-")
	if !ok || strings.Contains(version, "-") || NormalizeName(name) != fn.Name() || !sameVersion(version, fn.Version) {
		return "", v.bad("its metadata directory %s does not match the filename's %s %s", dir, fn.Distribution, fn.Version)
	}
	return dir, nil
}

// sameVersion says whether a and b are the same PEP 440 version.
func sameVersion(a, b string) bool {
	ka, err1 := versionKey(a)
	kb, err2 := versionKey(b)
	return err1 == nil && err2 == nil && ka == kb
}

// checkMetadata checks that METADATA's Name and Version are the filename's
// and returns the version as METADATA writes it.
func (v *validator) checkMetadata(distInfo string, fn Filename) (string, error) {
	data, err := v.read(distInfo+"/METADATA", v.limits.MaxMetadataBytes)
	if err != nil {
		return "", err
	}
	h, err := parseHeaders(data, "Name", "Version")
	if err != nil {
		return "", v.bad("%s/METADATA: %v", distInfo, err)
	}
	name, version := h["Name"], h["Version"]
	if NormalizeName(name) != fn.Name() {
		return "", v.bad("METADATA names the project %q, the filename %q", name, fn.Distribution)
	}
	if !sameVersion(version, fn.Version) {
		return "", v.bad("METADATA says version %q, the filename %q", version, fn.Version)
	}
	return version, nil
}

// checkWheelFile checks the WHEEL file's Wheel-Version: 1.x is the only
// major version installers support.
func (v *validator) checkWheelFile(distInfo string) error {
	data, err := v.read(distInfo+"/WHEEL", v.limits.MaxMetadataBytes)
	if err != nil {
		return err
	}
	h, err := parseHeaders(data, "Wheel-Version")
	if err != nil {
		return v.bad("%s/WHEEL: %v", distInfo, err)
	}
	if major, _, _ := strings.Cut(h["Wheel-Version"], "."); major != "1" {
		return v.bad("%s/WHEEL says Wheel-Version %q; only 1.x is supported", distInfo, h["Wheel-Version"])
	}
	return nil
}

// read returns the content of the regular file name, at most max bytes.
func (v *validator) read(name string, max int64) ([]byte, error) {
	f, ok := v.files[name]
	if !ok {
		return nil, v.bad("it has no %s", name)
	}
	if f.UncompressedSize64 > uint64(max) {
		return nil, v.bad("%s is %d bytes, more than the limit of %d", name, f.UncompressedSize64, max)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, v.bad("open %s: %v", name, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, v.bad("read %s: %v", name, err)
	}
	if int64(len(data)) > max {
		return nil, v.bad("%s is more than the limit of %d bytes", name, max)
	}
	return data, nil
}

// parseHeaders reads the RFC 822 header block of a METADATA or WHEEL file
// (up to the first empty line) and returns the wanted fields, each of which
// must appear exactly once.
func parseHeaders(data []byte, want ...string) (map[string]string, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not UTF-8")
	}
	h := map[string]string{}
	for _, k := range want {
		h[k] = ""
	}
	seen := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue // a continuation line
		}
		k, val, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("header line %q has no colon", truncate(line, 80))
		}
		for _, w := range want {
			if strings.EqualFold(strings.TrimSpace(k), w) {
				seen[w]++
				h[w] = strings.TrimSpace(val)
			}
		}
	}
	for _, w := range want {
		if seen[w] != 1 || h[w] == "" {
			return nil, fmt.Errorf("want exactly one non-empty %s field, found %d", w, seen[w])
		}
	}
	return h, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
