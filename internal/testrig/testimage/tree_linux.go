package testimage

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// selection decides which part of a tree goes into a layer. rel is a
// slash-separated path relative to the root, without a trailing slash. emit
// says whether rel gets an entry; descend whether the walk enters rel when
// it is a directory.
type selection func(rel string) (emit, descend bool)

// everything selects the whole tree.
func everything(string) (bool, bool) { return true, true }

// fileID names an inode, to find the hardlinks of a layer.
type fileID struct{ dev, ino uint64 }

// layerStats counts what a layerWriter wrote and skipped.
type layerStats struct {
	Entries   int      // tar entries, hardlinks included
	Hardlinks int      // entries written as TypeLink
	Bytes     int64    // regular file content
	Setid     []string // entries with the setuid or setgid bit (directories too)
	Skipped   []string // device nodes, sockets and fifos left out
}

// layerWriter writes the entries of one layer to a tar stream: trees walked
// in a deterministic order, and fixtures. The second and later names of an
// inode within the layer become hardlinks to the first.
type layerWriter struct {
	tw    *tar.Writer
	links map[fileID]string
	stats layerStats
}

func newLayerWriter(w io.Writer) *layerWriter {
	return &layerWriter{tw: tar.NewWriter(w), links: make(map[fileID]string)}
}

// close writes the tar trailer.
func (w *layerWriter) close() error {
	if err := w.tw.Close(); err != nil {
		return fmt.Errorf("finish tar stream: %w", err)
	}
	return nil
}

// writeTree writes the entries of root that sel selects, the root itself
// excluded. Siblings come in lexical order and a directory before its
// children (filepath.WalkDir order).
func (w *layerWriter) writeTree(ctx context.Context, root string, sel selection) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		emit, descend := sel(rel)
		if emit {
			if err := w.writePath(root, rel); err != nil {
				return err
			}
		}
		if d.IsDir() && !descend {
			return filepath.SkipDir
		}
		return nil
	})
}

// writePath writes the entry for root/rel as it is on the disk: numeric
// owner, permission bits with setuid, setgid and sticky, mtime in seconds,
// symlink targets verbatim. Device nodes, sockets and fifos are skipped.
func (w *layerWriter) writePath(root, rel string) error {
	p := filepath.Join(root, filepath.FromSlash(rel))
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("stat %s: no unix stat data", p)
	}
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, 0).UTC(),
	}
	switch fi.Mode().Type() {
	case fs.ModeDir:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case fs.ModeSymlink:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(p); err != nil {
			return err
		}
	case 0:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fi.Size()
	default:
		w.stats.Skipped = append(w.stats.Skipped, rel)
		return nil
	}
	if hdr.Typeflag != tar.TypeDir && st.Nlink > 1 {
		id := fileID{dev: st.Dev, ino: st.Ino}
		if first, ok := w.links[id]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			w.links[id] = rel
		}
	}
	if hdr.Typeflag != tar.TypeReg {
		return w.writeHeader(hdr)
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := w.writeHeader(hdr); err != nil {
		return err
	}
	// CopyN: a file that changed size since Lstat fails the build instead
	// of producing a broken stream.
	if _, err := io.CopyN(w.tw, f, hdr.Size); err != nil {
		return fmt.Errorf("write %s: %w", rel, err)
	}
	w.stats.Bytes += hdr.Size
	return nil
}

// writeEntries writes fixtures.
func (w *layerWriter) writeEntries(entries []entry) error {
	for _, e := range entries {
		hdr := e.hdr
		if err := w.writeHeader(&hdr); err != nil {
			return err
		}
		if _, err := io.WriteString(w.tw, e.body); err != nil {
			return fmt.Errorf("write %s: %w", hdr.Name, err)
		}
		w.stats.Bytes += int64(len(e.body))
	}
	return nil
}

// writeFixtures writes groups of fixtures, each after the entry for its
// parent directory: from the tree unless treeWritten says the walk already
// wrote it, or a fixture directory when the tree lacks it.
func (w *layerWriter) writeFixtures(root string, groups []fixtureGroup, treeWritten bool) error {
	for _, g := range groups {
		_, err := os.Lstat(filepath.Join(root, filepath.FromSlash(g.parent)))
		switch {
		case err == nil && !treeWritten:
			err = w.writePath(root, g.parent)
		case err != nil:
			err = w.writeEntries([]entry{dirEntry(g.parent, 0o755)})
		}
		if err != nil {
			return err
		}
		if err := w.writeEntries(g.entries); err != nil {
			return err
		}
	}
	return nil
}

func (w *layerWriter) writeHeader(hdr *tar.Header) error {
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write tar header %s: %w", hdr.Name, err)
	}
	w.stats.Entries++
	if hdr.Typeflag == tar.TypeLink {
		w.stats.Hardlinks++
	}
	if hdr.Mode&(0o4000|0o2000) != 0 {
		w.stats.Setid = append(w.stats.Setid, strings.TrimSuffix(hdr.Name, "/"))
	}
	return nil
}
