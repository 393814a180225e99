// Package app is the flmbox command line, built with urfave/cli: global
// flags, one command per noun (images, sandbox, pipcache) and per verb
// (prewarm, run, bench), and the hidden agent command that runs inside every
// sandbox. The flmbox-core binary runs it; the flmbox binary runs warm calls
// (flmbox run --sandbox) itself and hands everything else to flmbox-core.
package app
