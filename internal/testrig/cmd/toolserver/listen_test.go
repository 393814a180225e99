package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestListen(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
		err   string // the error's end, "" for none
	}{
		{name: "nothing there", setup: func(*testing.T, string) {}},
		{
			name: "a stale socket",
			setup: func(t *testing.T, path string) {
				ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				ln.SetUnlinkOnClose(false)
				ln.Close()
			},
		},
		{
			name: "a live socket",
			setup: func(t *testing.T, path string) {
				ln, err := net.Listen("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
			},
			err: "another server is listening there",
		},
		{
			name:  "a regular file",
			setup: func(t *testing.T, path string) { write(t, path) },
			err:   "refusing to replace a regular file, not a socket",
		},
		{
			name: "a directory",
			setup: func(t *testing.T, path string) {
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			err: "refusing to replace a directory, not a socket",
		},
		{
			name: "a symbolic link to a socket",
			setup: func(t *testing.T, path string) {
				sock := filepath.Join(filepath.Dir(path), "t")
				ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				ln.SetUnlinkOnClose(false)
				ln.Close()
				if err := os.Symlink(sock, path); err != nil {
					t.Fatal(err)
				}
			},
			err: "refusing to replace a symbolic link, not a socket",
		},
		{
			name: "a named pipe",
			setup: func(t *testing.T, path string) {
				if err := syscall.Mkfifo(path, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			err: "refusing to replace a named pipe, not a socket",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s")
			tt.setup(t, path)
			before, _ := os.Lstat(path)
			ln, err := listen(path)
			if tt.err != "" {
				if err == nil {
					ln.Close()
					t.Fatalf("listen succeeded, want an error ending %q", tt.err)
				}
				if !strings.HasSuffix(err.Error(), tt.err) {
					t.Fatalf("error %q, want one ending %q", err, tt.err)
				}
				after, err := os.Lstat(path)
				if err != nil || !os.SameFile(before, after) {
					t.Errorf("%s was replaced or removed (%v)", path, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial the new socket: %v", err)
			}
			c.Close()
			ln.Close()
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("the socket is still there after the listener's close (%v)", err)
			}
		})
	}
}

// write makes a regular file at path.
func write(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
