package app

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

// poolInfo is a line of `pool ls`.
type poolInfo struct {
	Shape       string          `json:"shape"`
	Image       string          `json:"image"`
	Manifest    string          `json:"manifest"`
	Network     sandbox.Network `json:"network"`
	Limits      sandbox.Limits  `json:"limits"`
	TmpBytes    int64           `json:"tmp_bytes,omitempty"`
	Env         []string        `json:"env,omitempty"`
	Pip         []string        `json:"pip,omitempty"`
	Size        int             `json:"size"`
	IdleTimeout float64         `json:"idle_timeout_seconds"`
	Idle        []string        `json:"idle"`
	OldestIdle  *time.Time      `json:"oldest_idle,omitempty"`
	Refilling   bool            `json:"refilling"`
	RefillError string          `json:"refill_error,omitempty"`
	// MemoryBytes is the host memory (PSS) of the idle sandboxes.
	MemoryBytes int64 `json:"memory_bytes"`
}

func poolLsCommand() *cli.Command {
	return &cli.Command{
		Name:    "ls",
		Aliases: []string{"list"},
		Usage:   "list pools: their shape, idle sandboxes, size, oldest idle one and host memory (idle ones past their timeout are removed first)",
		Flags:   []cli.Flag{jsonFlag},
		Action: func(c *cli.Context) error {
			m, err := openManager(c)
			if err != nil {
				return err
			}
			pools, err := m.Pools(c.Context, sandbox.PoolsOptions{Memory: true})
			if err != nil {
				return err
			}
			return printPools(c, pools)
		},
	}
}

func printPools(c *cli.Context, pools []*sandbox.Pool) error {
	infos := []poolInfo{}
	for _, p := range pools {
		i := poolInfo{Shape: p.Shape, Image: p.Spec.Image, Manifest: p.Manifest, Network: p.Spec.Network, Limits: p.Spec.Limits,
			TmpBytes: p.Spec.TmpBytes, Env: p.Spec.Env, Pip: p.Spec.Pip, Size: p.Size, IdleTimeout: p.IdleTimeout.Seconds(),
			Idle: []string{}, Refilling: p.Refilling, RefillError: p.RefillError, MemoryBytes: p.MemoryKiB << 10}
		for _, sb := range p.Idle {
			i.Idle = append(i.Idle, sb.Name)
		}
		if !p.OldestIdle.IsZero() {
			i.OldestIdle = &p.OldestIdle
		}
		infos = append(infos, i)
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(infos)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHAPE\tIMAGE\tIDLE\tSIZE\tOLDEST IDLE\tMEMORY\tREFILL")
	for _, i := range infos {
		oldest, refill := "-", "-"
		if i.OldestIdle != nil {
			oldest = units.HumanDuration(time.Since(*i.OldestIdle)) + " ago"
		}
		switch {
		case i.Refilling:
			refill = "in progress"
		case i.RefillError != "":
			refill = "failed: " + i.RefillError
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", i.Shape, i.Image, len(i.Idle), i.Size, oldest,
			units.BytesSize(float64(i.MemoryBytes)), refill)
	}
	return tw.Flush()
}
