package app

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

// sandboxInfo is a line of `sandbox ls`.
type sandboxInfo struct {
	Name     string          `json:"name"`
	Image    string          `json:"image"`
	Network  sandbox.Network `json:"network"`
	State    sandbox.State   `json:"state"`
	Created  time.Time       `json:"created"`
	LastUsed time.Time       `json:"last_used"`
	// OwnerPID is the pid of the flmbox process that made the sandbox for
	// itself (run --image, run --batch --image) and removes it when done;
	// once that process is gone, so is the sandbox.
	OwnerPID int `json:"owner_pid,omitempty"`
	// ID is its runsc container ID (a pooled sandbox keeps it under every
	// name it takes); Shape names what it is made of (see pool ls).
	ID    string `json:"id"`
	Shape string `json:"shape,omitempty"`
	// Labels are the sandbox's (sandbox create --label).
	Labels map[string]string `json:"labels,omitempty"`
	// ImageBytes is the size of a suspended sandbox's checkpoint image.
	ImageBytes int64 `json:"image_bytes,omitempty"`
	// Egress is an egress sandbox's policy and what it refused.
	Egress *egressInfo `json:"egress,omitempty"`
}

// egressInfo is an egress sandbox's policy and its refusals.
type egressInfo struct {
	Allow        []sandbox.EgressRule  `json:"allow"`
	Deny         []sandbox.EgressRule  `json:"deny,omitempty"`
	Refused      []sandbox.Refusal     `json:"refused"`
	RefusedNames []sandbox.RefusedName `json:"refused_names"`
	// RefusedClasses are the packets refused by class, totals that never
	// saturate (Refused keeps 4,096 destinations, an hour each).
	RefusedClasses []sandbox.RefusalClass `json:"refused_classes"`
}

func egressInfoOf(st *sandbox.EgressStatus) *egressInfo {
	if st == nil {
		return nil
	}
	i := &egressInfo{Allow: st.Policy.Allow, Deny: st.Policy.Deny, Refused: st.Refused, RefusedNames: st.RefusedNames,
		RefusedClasses: st.RefusedClasses}
	if i.Allow == nil {
		i.Allow = []sandbox.EgressRule{}
	}
	if i.Refused == nil {
		i.Refused = []sandbox.Refusal{}
	}
	if i.RefusedNames == nil {
		i.RefusedNames = []sandbox.RefusedName{}
	}
	if i.RefusedClasses == nil {
		i.RefusedClasses = []sandbox.RefusalClass{}
	}
	return i
}

func sandboxLsCommand() *cli.Command {
	return &cli.Command{
		Name:    "ls",
		Aliases: []string{"list"},
		Usage:   "list sandboxes (dead: its gVisor sandbox process is gone; with --probe, unresponsive: its agent did not answer in 5s)",
		Flags: []cli.Flag{jsonFlag,
			&cli.BoolFlag{Name: "probe", Usage: "ping every running sandbox's agent (all at once, each within 5s)"},
			&cli.GenericFlag{Name: "filter", Aliases: []string{"f"}, Value: &stringList{}, Usage: "list only the sandboxes with label K (`label=K`) or with K=V (label=K=V) (repeatable: all of them)"}},
		Action: func(c *cli.Context) error {
			m, err := openManager(c)
			if err != nil {
				return err
			}
			// What a killed flmbox left goes first. A sandbox whose gVisor
			// sandbox process is gone is dead (List reads /proc); with
			// --probe each running one's agent is pinged, all at once and
			// each within bounds, so that one that hangs never delays or
			// mislabels another.
			if err := m.Reconcile(c.Context); err != nil {
				warnf(c, "%v", err)
			}
			sel := map[string]string{}
			for _, f := range listFlag(c, "filter") {
				kv, ok := strings.CutPrefix(f, "label=")
				if !ok || kv == "" {
					return fmt.Errorf("--filter %q: want label=K or label=K=V", f)
				}
				k, v, _ := strings.Cut(kv, "=")
				sel[k] = v
			}
			sbs, err := m.ListLabeled(c.Context, sel)
			if err != nil {
				return err
			}
			if c.Bool("probe") {
				sbs = m.Probe(c.Context, sbs...)
			}
			infos := []sandboxInfo{}
			for _, sb := range sbs {
				infos = append(infos, sandboxInfo{Name: sb.Name, Image: sb.Image, Network: sb.Network, State: sb.State,
					Created: sb.Created, LastUsed: sb.LastUsed, OwnerPID: sb.OwnerPID, ID: sb.ID, Shape: sb.Shape, ImageBytes: sb.ImageBytes,
					Egress: egressInfoOf(sb.Egress), Labels: sb.Labels})
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(infos)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tIMAGE\tNETWORK\tSTATE\tCREATED\tLAST USED")
			for _, i := range infos {
				state := string(i.State)
				if i.ImageBytes > 0 {
					state += " (" + units.BytesSize(float64(i.ImageBytes)) + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s ago\n", i.Name, i.Image, i.Network, state,
					units.HumanDuration(time.Since(i.Created)), units.HumanDuration(time.Since(i.LastUsed)))
			}
			return tw.Flush()
		},
	}
}
