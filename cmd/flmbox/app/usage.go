package app

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// A command line that does not parse is said in one line that names the
// flag and what it takes, never with urfave/cli's "Incorrect Usage" and the
// command's help: see usageError. Run exits 125 for it, as for any failure
// of flmbox's own.

// setUsageErrors makes usageError say the parse errors of cmds and their
// subcommands (urfave/cli's App.OnUsageError covers only the global flags).
func setUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = usageError
		// No "help" subcommand, nor its alias "h": cli adds one to every
		// command, which then takes an argument "h" or "help" as itself
		// (sandbox rm h printed help). --help and -h stay.
		c.HideHelpCommand = true
		if len(c.Subcommands) > 0 && c.Action == nil {
			c.Action = unknownCommand
		}
		setUsageErrors(c.Subcommands)
	}
}

// unknownCommand is the action of flmbox and of its commands that have
// subcommands: it shows the help when no command is named, and says in one
// line that there is no such command when one is (cli's own said "No help
// topic for 'frob'" and exited 3).
func unknownCommand(c *cli.Context) error {
	if !c.Args().Present() {
		return cli.ShowSubcommandHelp(c)
	}
	return fmt.Errorf("%s has no command %q; %s --help lists them", c.Command.Name, c.Args().First(), helpName(c))
}

// unknownTopCommand is unknownCommand of flmbox itself.
func unknownTopCommand(c *cli.Context) error {
	if !c.Args().Present() {
		return cli.ShowAppHelp(c)
	}
	return fmt.Errorf("no command %q; flmbox --help lists them", c.Args().First())
}

// The errors of Go's flag package, which urfave/cli parses with.
var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -(.+)$`)
	missingValue  = regexp.MustCompile(`^flag needs an argument: -(.+)$`)
	invalidValue  = regexp.MustCompile(`^invalid value (".*") for flag -([^ :]+): (.*)$`)
	invalidBool   = regexp.MustCompile(`^invalid boolean value (".*") for -([^ :]+): (.*)$`)
)

// usageError is a cli.OnUsageErrorFunc: err, an error of Go's flag package,
// in one line that names the flag and what it wants, or where the flags are
// listed.
func usageError(c *cli.Context, err error, _ bool) error {
	msg := err.Error()
	list := helpName(c) + " --help lists the flags"
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("flag provided but not defined: %s; %s", dashed(m[1]), list)
	}
	if m := missingValue.FindStringSubmatch(msg); m != nil {
		if w := wantOf(findFlag(c, m[1])); w != "" {
			return fmt.Errorf("%s needs a value: %s", dashed(m[1]), w)
		}
		return fmt.Errorf("%s needs a value; %s", dashed(m[1]), list)
	}
	m := invalidValue.FindStringSubmatch(msg)
	if m == nil {
		m = invalidBool.FindStringSubmatch(msg)
	}
	if m != nil {
		value, qerr := strconv.Unquote(m[1])
		if qerr != nil {
			value = m[1]
		}
		why := m[3]
		if w := wantOf(findFlag(c, m[2])); w != "" {
			why = "want " + w
		}
		return fmt.Errorf("%s %s: %s", dashed(m[2]), value, why)
	}
	// Anything else (a bad value from an environment variable, bad flag
	// syntax) is one line already.
	return fmt.Errorf("%s; %s", strings.ReplaceAll(msg, "\n", " "), list)
}

// helpName is the command as a person types it: "flmbox run".
func helpName(c *cli.Context) string {
	if c.Command != nil && c.Command.HelpName != "" {
		return c.Command.HelpName
	}
	return "flmbox"
}

// dashed is flag name as written on the command line: -x, --name.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// findFlag is the flag of c's command (or the global one) named name.
func findFlag(c *cli.Context, name string) cli.Flag {
	var flags []cli.Flag
	if c.Command != nil {
		flags = c.Command.Flags
	}
	if c.App != nil {
		flags = append(flags[:len(flags):len(flags)], c.App.Flags...)
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// wantOf says what value f takes, or "" when any string is one.
func wantOf(f cli.Flag) string {
	switch f := f.(type) {
	case *cli.GenericFlag:
		if d, ok := f.Value.(*durationValue); ok {
			return d.want()
		}
	case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag:
		return "a whole number"
	case *cli.Float64Flag:
		return "a number such as 2 or 0.5"
	case *cli.BoolFlag:
		return "true or false"
	case *cli.DurationFlag:
		return "a duration such as 30s"
	}
	return ""
}

// durationValue is the value of a duration flag (durationFlag): one that
// time.ParseDuration reads, positive, or 0 too where zeroOK. A value out of
// range is refused as it is parsed, so that it is said as a usage error
// naming the flag (usageError). c.Duration reads it through String.
type durationValue struct {
	d      time.Duration
	zeroOK bool
}

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || (d == 0 && !v.zeroOK) {
		return errors.New("want " + v.want())
	}
	v.d = d
	return nil
}

// String is the duration, or "" for 0 (help then shows no default).
func (v *durationValue) String() string {
	if v.d == 0 {
		return ""
	}
	return v.d.String()
}

func (v *durationValue) want() string {
	if v.zeroOK {
		return "0 or a duration such as 30s"
	}
	return "a positive duration such as 30s"
}

// durationFlag is a flag of a positive duration whose default is value (0:
// none); c.Duration reads it.
func durationFlag(name string, value time.Duration, usage string) *cli.GenericFlag {
	return &cli.GenericFlag{Name: name, Value: &durationValue{d: value}, Usage: usage}
}

// durationOrZeroFlag is durationFlag of a duration that may also be 0.
func durationOrZeroFlag(name string, value time.Duration, usage string) *cli.GenericFlag {
	return &cli.GenericFlag{Name: name, Value: &durationValue{d: value, zeroOK: true}, Usage: usage}
}

// required refuses a command line without the flags named: urfave/cli's
// Required would print the command's whole help.
func required(c *cli.Context, names ...string) error {
	for _, n := range names {
		if !c.IsSet(n) {
			return fmt.Errorf("%s needs %s; %s --help lists the flags", strings.TrimPrefix(helpName(c), "flmbox "), dashed(n), helpName(c))
		}
	}
	return nil
}
