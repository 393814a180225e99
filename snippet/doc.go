// Package snippet runs code inside sandboxes: the resident agent that runs
// in every sandbox (flmbox-agent) and the client that talks to it over a
// Unix socket (flmbox run).
//
// # Protocol
//
// A call is one connection to the agent's socket. The client writes one JSON
// Request and half-closes the connection (shutdown of its write side); the
// agent writes one JSON Result and closes. Output bytes ([]byte) travel as
// base64, so output that is not UTF-8 arrives unchanged. Both sides bound
// what they read: the agent a request with the largest code (MaxCodeSize)
// JSON-escaped, the client twice the request's MaxOutput in base64 plus
// 64 KiB. A client that closes the connection before the answer cancels the
// call: the agent kills the snippet.
//
// Requests and results carry ProtocolVersion. An agent that gets a request of
// another version answers a Result with its own version, ExitCode -1 and an
// Error naming both versions; Call turns a result of another version into an
// error that says to recreate the sandbox.
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
