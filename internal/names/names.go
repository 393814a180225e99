// Package names checks the names flmbox turns into file names: sandbox
// names and the holders of image leases.
package names

// Valid says whether s is 1 to max bytes of [A-Za-z0-9_.-] starting with a
// letter or digit: no path separators, no "." or "..", nothing hidden. (A
// regexp with {0,N} does the same but costs a fraction of a millisecond at
// every start of flmbox.)
func Valid(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i, c := range []byte(s) {
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}
