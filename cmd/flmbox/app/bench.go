package app

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// benchCommand is a placeholder until package bench lands.
func benchCommand() *cli.Command {
	return &cli.Command{Name: "bench", Action: func(*cli.Context) error { return fmt.Errorf("not yet") }}
}
