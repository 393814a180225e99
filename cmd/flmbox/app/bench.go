package app

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
)

// BenchUsage is flmbox bench's line in flmbox --help. flmbox-bench's bench
// command says it too.
const BenchUsage = "measure this worker: sandbox allocation, warm calls, flmbox instance, callbacks, batch throughput, prewarm, memory, each beside its baseline; density with --density N"

// benchName is the binary that implements flmbox bench, next to flmbox-core.
const benchName = "flmbox-bench"

// benchInstall is what to do when flmbox-bench is missing or of another
// build.
const benchInstall = "install flmbox, flmbox-core, flmbox-bench and flmbox-agent of one build in one directory (make build puts them in bin/)"

// benchCommand is flmbox bench, which flmbox-bench implements
// (cmd/flmbox-bench). The bench serves its image from an in-process registry
// and drives flmbox instance under a Flame simulator: test rigs, which
// flmbox-core does not link. So flmbox-core hands bench's command line to
// flmbox-bench next to it, as flmbox hands its own to flmbox-core: by exec,
// in the same process, with the same stdio and environment, after checking
// that it is of the same build. Its flags, --help included, are
// flmbox-bench's to parse.
func benchCommand() *cli.Command {
	return &cli.Command{
		Name:            "bench",
		Usage:           BenchUsage,
		SkipFlagParsing: true,
		Action:          execBench,
	}
}

// execBinary replaces this process with the program at path
// (syscall.Exec); it returns only on failure.
var execBinary = defaultExec

var defaultExec = syscall.Exec

func execBench(c *cli.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find %s: %w", benchName, err)
	}
	bin := filepath.Join(filepath.Dir(self), benchName)
	if err := runcmd.SameBuild(bin); err != nil {
		return advise(fmt.Errorf("run %s: %w", benchName, err), benchInstall)
	}
	err = execBinary(bin, benchArgs(c, bin), os.Environ())
	return advise(fmt.Errorf("run %s: %w", bin, err), benchInstall)
}

// benchArgs is flmbox-bench's command line: the global flags that are set
// (on the command line or by their environment variables) as --name=value,
// then bench and its arguments as they were given.
func benchArgs(c *cli.Context, bin string) []string {
	args := []string{bin}
	for _, f := range runcmd.GlobalFlags {
		if c.IsSet(f.Name) {
			args = append(args, fmt.Sprintf("--%s=%v", f.Name, c.Value(f.Name)))
		}
	}
	return append(append(args, "bench"), c.Args().Slice()...)
}
