// Package errkind makes the tree's sentinel errors: each of one
// github.com/containerd/errdefs kind, and equal to no other.
package errkind

// New returns a new sentinel error of kind (an errdefs kind, such as
// errdefs.ErrNotFound), whose text is msg: errors.Is matches it and its
// kind. It is a pointer, so that two sentinels of one kind and text are
// never equal (errdefs' own WithMessage values are).
func New(kind error, msg string) error { return &sentinel{kind: kind, msg: msg} }

type sentinel struct {
	kind error
	msg  string
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.kind }

// Of returns a new sentinel of kind whose text is the kind's own ("not
// found"), for an error whose message says the rest: a message that wraps
// it reads as one that wraps the kind.
func Of(kind error) error { return New(kind, kind.Error()) }
