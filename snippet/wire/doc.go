// Package wire is the protocol between flmbox on the host and the agent in
// each sandbox (package snippet's Agent), and its client: the types that
// travel (Request, Result, Event, Copy), their bounds and validation, and
// the calls that send them (Dial, Call, CallConn, CopyConn, Attach,
// Forward). It does not import package net, so that the flmbox command's
// warm calls start quickly.
//
// # Calls
//
// A call is one connection to the agent's Unix socket. The client writes
// one JSON Request; the agent writes one JSON Result and closes. Output bytes
// ([]byte) travel as base64, so output that is not UTF-8 arrives unchanged.
// Both sides bound what they read: the agent a request with the largest
// code, env and stdin, JSON-escaped; the client twice the request's
// MaxOutput in base64 plus 64 KiB (and its callback events).
//
// An Interruptible request's client keeps its side of the connection open
// for writing, and shutting it down (SHUT_WR) interrupts the call: the agent
// kills the snippet and answers with what it printed so far
// (Result.Interrupted). Until then it may write MemoryNudge bytes on it
// (Request.MemoryNudges): the sandbox's memory grew, as the host counts it.
// Otherwise (a Ping, an older client) the client shuts it down right after
// the request. A client that closes the
// connection cancels the call: the agent kills the snippet. A Ping request
// is answered at once, whatever the calls running; a Suspend request readies
// the sandbox for a checkpoint.
//
// # Versions
//
// Requests and results carry ProtocolVersion. An agent that gets a request
// of another version answers a Result with its own version, ExitCode -1 and
// an Error naming both versions; Call turns a result of another version into
// an error matching ErrProtocolVersion, which says to recreate the sandbox.
//
// # Callbacks and copies
//
// A call with a Callback lets its snippet reach a server of the caller's:
// the agent sends Events on the call's connection before the Result, and
// the client attaches more connections to the agent's socket (Request.Attach,
// Standby, Frames), each carrying the bytes of one or, framed, several of
// the snippet's connections (CallbackData, CallbackEnd). A Copy request
// carries a tar stream in frames after the request, in one direction, then
// the Result.
package wire
