package runcmd

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// HoistFlags moves a command's flags that follow its positional arguments to
// before them. urfave/cli v2 stops parsing flags at the first positional
// argument, while docker-style usage puts them anywhere:
// `flmbox prewarm IMAGE --platform linux/arm64 --json`. A "--" ends the
// flags, as usual; a lone "-" is a positional argument (stdin). Both
// binaries read their command lines so: flmbox-core's app, and the flmbox
// command's warm calls.
func HoistFlags(app *cli.App, args []string) []string {
	if len(args) == 0 {
		return args
	}
	out := []string{args[0]}
	flags, cmds := app.Flags, app.Commands
	var cmd *cli.Command
	i := 1
	// Flags and command names up to the innermost command.
	for i < len(args) {
		a := args[i]
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			out = append(out, a)
			i++
			if takesValue(flags, a) && i < len(args) {
				out = append(out, args[i])
				i++
			}
			continue
		}
		c := findCommand(cmds, a)
		if c == nil {
			break
		}
		out = append(out, a)
		i++
		cmd, flags, cmds = c, c.Flags, c.Subcommands
		if len(cmds) == 0 {
			break
		}
	}
	if cmd == nil || cmd.SkipFlagParsing {
		return args // a command that parses its own flags (bench) takes them as written
	}
	var flagArgs, positional []string
	for i < len(args) {
		a := args[i]
		i++
		if a == "--" {
			positional = append(positional, args[i-1:]...)
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			flagArgs = append(flagArgs, a)
			if takesValue(flags, a) {
				if i == len(args) {
					// Its value is missing: hoisted before the arguments,
					// it would take the first as its value. Without them,
					// the parse says what is missing.
					return append(out, flagArgs...)
				}
				flagArgs = append(flagArgs, args[i])
				i++
			}
			continue
		}
		positional = append(positional, a)
	}
	return append(append(out, flagArgs...), positional...)
}

// takesValue reports whether arg ("--name" or "-n") names a flag that takes
// a separate value (not a boolean, not written as --name=value).
func takesValue(flags []cli.Flag, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				_, isBool := f.(*cli.BoolFlag)
				return !isBool
			}
		}
	}
	return false
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}
