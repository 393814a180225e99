package testimage

import (
	"archive/tar"
	"os"
	"time"
)

// Facts about the linux/amd64 image that tests check against its unpacked
// tree. Paths are relative to the root, without a leading slash. The
// fixtures are owned by 0:0 and have the modification time FixtureTime.
const (
	// RemovedFile is present in layer 1 and deleted by the whiteout
	// etc/flmbox-test/.wh.removed.txt in layer 3: absent after unpacking.
	RemovedFile = "etc/flmbox-test/removed.txt"
	// OpaqueDir holds old.txt and sub/deep.txt in layer 1; layer 3 marks it
	// opaque (.wh..wh..opq) and adds new.txt.
	OpaqueDir = "opt/flmbox-test/replaced"
	// OpaqueOld is in OpaqueDir in layer 1: absent after unpacking.
	OpaqueOld = "opt/flmbox-test/replaced/old.txt"
	// OpaqueDeep is in a subdirectory of OpaqueDir in layer 1: absent after
	// unpacking, as is its directory opt/flmbox-test/replaced/sub.
	OpaqueDeep = "opt/flmbox-test/replaced/sub/deep.txt"
	// OpaqueNew is added to OpaqueDir by layer 3, next to the opaque marker:
	// present after unpacking, with the content OpaqueNewContent.
	OpaqueNew = "opt/flmbox-test/replaced/new.txt"
	// OpaqueNewContent is the content of OpaqueNew.
	OpaqueNewContent = "new\n"

	// SetuidFile is a shell script added by layer 3 with mode SetuidMode.
	SetuidFile = "opt/flmbox-test/setuid.sh"
	// SetuidMode is the mode of SetuidFile, as os.Lstat reports it.
	SetuidMode = os.ModeSetuid | 0o755
	// StickyDir is an empty directory added by layer 3 with mode StickyMode.
	StickyDir = "opt/flmbox-test/sticky"
	// StickyMode is the mode of StickyDir, as os.Lstat reports it (without
	// os.ModeDir).
	StickyMode = os.ModeSticky | 0o777
	// HardlinkFirst is a regular file added by layer 3 with the content
	// HardlinkContent.
	HardlinkFirst = "opt/flmbox-test/hardlink-a.txt"
	// HardlinkSecond is a hardlink (tar TypeLink) to HardlinkFirst in the
	// same layer: after unpacking both names are one inode.
	HardlinkSecond = "opt/flmbox-test/hardlink-b.txt"
	// HardlinkContent is the content of HardlinkFirst and HardlinkSecond.
	HardlinkContent = "linked\n"
	// Symlink is a symbolic link added by layer 3 with the target
	// SymlinkTarget, relative to its directory; it resolves to OpaqueNew.
	Symlink = "opt/flmbox-test/symlink"
	// SymlinkTarget is the target of Symlink, stored verbatim.
	SymlinkTarget = "replaced/new.txt"

	// PlaceholderFile is the only file of the linux/arm64 placeholder image.
	PlaceholderFile = "hello.txt"
	// PlaceholderContent is the content of PlaceholderFile.
	PlaceholderContent = "placeholder for arm64\n"
)

// FixtureTime is the modification time of every fixture entry and the
// creation time recorded in the image configs and histories.
var FixtureTime = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Whiteout names (OCI image spec, "Representing Changes").
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// entry is a tar entry that is not read from the tree.
type entry struct {
	hdr  tar.Header
	body string
}

func fixture(typ byte, name string, mode int64, body, link string) entry {
	e := entry{hdr: tar.Header{
		Typeflag: typ,
		Name:     name,
		Linkname: link,
		Mode:     mode,
		ModTime:  FixtureTime,
	}, body: body}
	if typ == tar.TypeReg {
		e.hdr.Size = int64(len(body))
	}
	return e
}

func dirEntry(name string, mode int64) entry {
	return fixture(tar.TypeDir, name+"/", mode, "", "")
}

func fileEntry(name string, mode int64, body string) entry {
	return fixture(tar.TypeReg, name, mode, body, "")
}

// fixtureGroup is a list of fixtures under one top-level directory of the
// tree, in tar order.
type fixtureGroup struct {
	parent  string
	entries []entry
}

// lowerFixtures are appended to layer 1, after the tree: the files that
// layer 3 deletes or hides.
func lowerFixtures() []fixtureGroup {
	return []fixtureGroup{
		{"etc", []entry{
			dirEntry("etc/flmbox-test", 0o755),
			fileEntry(RemovedFile, 0o644, "removed by a whiteout in the top layer\n"),
		}},
		{"opt", []entry{
			dirEntry("opt/flmbox-test", 0o755),
			dirEntry(OpaqueDir, 0o755),
			fileEntry(OpaqueOld, 0o644, "old\n"),
			dirEntry(OpaqueDir+"/sub", 0o755),
			fileEntry(OpaqueDeep, 0o644, "deep\n"),
		}},
	}
}

// topFixtures are layer 3, in tar order: a directory before its children,
// siblings in lexical order, and the opaque marker first in its directory.
func topFixtures() []fixtureGroup {
	return []fixtureGroup{
		{"etc", []entry{
			dirEntry("etc/flmbox-test", 0o755),
			fileEntry("etc/flmbox-test/"+whiteoutPrefix+"removed.txt", 0o644, ""),
		}},
		{"opt", []entry{
			dirEntry("opt/flmbox-test", 0o755),
			fileEntry(HardlinkFirst, 0o644, HardlinkContent),
			fixture(tar.TypeLink, HardlinkSecond, 0o644, "", HardlinkFirst),
			dirEntry(OpaqueDir, 0o755),
			fileEntry(OpaqueDir+"/"+opaqueMarker, 0o644, ""),
			fileEntry(OpaqueNew, 0o644, OpaqueNewContent),
			fileEntry(SetuidFile, 0o4755, "#!/bin/sh\nid -u\n"),
			dirEntry(StickyDir, 0o1777),
			fixture(tar.TypeSymlink, Symlink, 0o777, "", SymlinkTarget),
		}},
	}
}

// placeholderFixtures are the one layer of the linux/arm64 image.
func placeholderFixtures() []entry {
	return []entry{fileEntry(PlaceholderFile, 0o644, PlaceholderContent)}
}
