// Package app is the flmbox command line, built with urfave/cli: global
// flags, one command per noun (images, sandbox, pipcache) and per verb
// (prewarm, run, bench), and the hidden agent command that runs inside every
// sandbox. The flmbox-core binary runs it; the flmbox binary runs warm calls
// (flmbox run --sandbox) itself and hands everything else to flmbox-core.
// flmbox bench is flmbox-bench's (cmd/flmbox-bench), which runs it with
// RunCommand: flmbox-core hands its command line on unparsed.
package app
