// Package runcmd is what flmbox's binaries share of the command line: the
// global flags and run's flags, as one table from which both parsers come
// (urfave/cli's, in flmbox-core and in the flmbox command's warm calls,
// both after HoistFlags), how run prints a result and chooses its exit
// status, and the check that a binary one hands a command line to is of
// its own build (SameBuild). It imports nothing heavier than package wire
// and urfave/cli, so that the flmbox command starts in milliseconds
// (docs/PERFORMANCE.md, "The flmbox command's own pieces").
package runcmd
