// Package snippet runs code inside sandboxes: the resident agent that runs
// in every sandbox as its first process (flmbox-agent), takes one request
// per connection on a Unix socket that the host connects to, and runs each
// snippet as the snippets' user, within its limits.
//
// The protocol between the host and the agent, its types and its client are
// package snippet/wire.
//
// # Running a snippet
//
// Agent.Run starts python3 or /bin/sh as a new process in its own process
// group, with stdin at EOF, and sets the request's rlimits on it before any
// of the snippet's code runs: the interpreter waits on a pipe (the gate, file
// descriptor 3) that the agent writes only once the limits are set, because
// Go cannot set rlimits between fork and exec. Python reads its code from
// that pipe and runs it, as python3 -c would, under the file name
// "<snippet>" (or, for a call with a File, under the name of a file it
// writes, as python3 FILE would); tracebacks show that name, the line number
// and the source line. Shell code runs with sh -c. stdout and stderr are
// captured separately, each keeping its first and last MaxOutput/2 bytes
// apart (wire.Output's Data and Tail), so the agent
// never holds more than the caps whatever a snippet prints. On timeout the
// whole process group is killed; when the snippet's process exits, whatever
// is left of its group is killed too.
//
// The package runs on Linux only.
package snippet
