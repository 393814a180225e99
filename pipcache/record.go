package pipcache

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/csv"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
)

// recordHashes are the hash algorithms accepted in RECORD. The wheel
// specification forbids md5 and sha1; pip writes sha256.
var recordHashes = map[string]func() hash.Hash{
	"sha256": sha256.New,
	"sha384": sha512.New384,
	"sha512": sha512.New,
}

// recordEntry is a line of RECORD.
type recordEntry struct {
	alg    string
	digest []byte
	size   int64 // -1: not given
}

// checkRecord checks RECORD against the archive: every file but RECORD
// (and its signatures) is listed with a matching hash and size, and every
// listed file exists. Each file is read whole, so this is where reading is
// bounded (by the declared sizes, checked earlier) and cancelled.
func (v *validator) checkRecord(distInfo string) error {
	recordName := distInfo + "/RECORD"
	data, err := v.read(recordName, v.limits.MaxRecordBytes)
	if err != nil {
		return err
	}
	record, err := parseRecord(data)
	if err != nil {
		return v.bad("%s: %v", recordName, err)
	}
	for name, f := range v.files {
		if name == recordName || name == recordName+".jws" || name == recordName+".p7s" {
			continue
		}
		e, ok := record[name]
		if !ok {
			return v.bad("%s is not listed in RECORD", name)
		}
		if err := v.checkHash(f, e); err != nil {
			return err
		}
	}
	for name := range record {
		if _, ok := v.files[name]; !ok && name != recordName {
			return v.bad("RECORD lists %s, which the wheel does not hold", name)
		}
	}
	return nil
}

// checkHash reads f whole and compares its hash and size with RECORD's.
func (v *validator) checkHash(f *zip.File, e recordEntry) error {
	if err := v.ctx.Err(); err != nil {
		return fmt.Errorf("validate wheel: %w", err)
	}
	rc, err := f.Open()
	if err != nil {
		return v.bad("open %s: %v", f.Name, err)
	}
	defer rc.Close()
	h := recordHashes[e.alg]()
	n, err := copyWithContext(v.ctx, h, rc)
	if err != nil {
		if v.ctx.Err() != nil {
			return fmt.Errorf("validate wheel: %w", v.ctx.Err())
		}
		return v.bad("read %s: %v", f.Name, err)
	}
	if e.size >= 0 && n != e.size {
		return v.bad("%s is %d bytes, RECORD says %d", f.Name, n, e.size)
	}
	if !bytes.Equal(h.Sum(nil), e.digest) {
		return v.bad("the %s of %s does not match RECORD (the wheel was altered)", e.alg, f.Name)
	}
	return nil
}

// copyWithContext copies src to dst in 1 MiB steps, stopping when ctx is
// done.
func copyWithContext(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, err := io.CopyN(dst, src, 1<<20)
		n += m
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// parseRecord parses RECORD: CSV lines path,algorithm=urlsafe-base64,size.
// Only RECORD itself may omit its hash.
func parseRecord(data []byte) (map[string]recordEntry, error) {
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = 3
	r.ReuseRecord = true
	out := map[string]recordEntry{}
	for {
		line, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		name, hashField, sizeField := line[0], line[1], line[2]
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%q is listed twice", name)
		}
		e := recordEntry{size: -1}
		if sizeField != "" {
			if e.size, err = strconv.ParseInt(sizeField, 10, 64); err != nil || e.size < 0 {
				return nil, fmt.Errorf("%q: size %q is not a number", name, sizeField)
			}
		}
		if hashField != "" {
			alg, b64, ok := strings.Cut(hashField, "=")
			if _, known := recordHashes[alg]; !ok || !known {
				return nil, fmt.Errorf("%q: hash %q: want sha256=, sha384= or sha512=", name, truncate(hashField, 20))
			}
			e.alg = alg
			if e.digest, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(b64, "=")); err != nil {
				return nil, fmt.Errorf("%q: hash is not URL-safe base64", name)
			}
		} else if !strings.HasSuffix(name, ".dist-info/RECORD") {
			return nil, fmt.Errorf("%q has no hash", name)
		}
		out[name] = e
	}
}
