// Package testprog writes the programs tests run (fake runsc, shell scripts,
// copies of binaries) so that running them never fails with ETXTBSY.
package testprog

import (
	"os"
	"syscall"
	"testing"
)

// Write writes data to path as an executable file. No process starts
// meanwhile: a child forked by a test running in parallel, before its exec,
// would hold the file open for writing, and executing the file would then
// fail with "text file busy".
func Write(t testing.TB, path string, data []byte) {
	t.Helper()
	syscall.ForkLock.RLock() // forks take it for writing
	defer syscall.ForkLock.RUnlock()
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
}
