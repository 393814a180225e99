package egress

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// Refusal counts the packets refused to one destination.
type Refusal struct {
	Destination netip.Addr `json:"destination"`
	// Port is 0 for a protocol without ports.
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
	Count    uint64 `json:"count"`
}

// Refusals reads what the table of the sandbox whose runsc ID is id has
// refused, by destination, most refused first. A sandbox without a table
// has refused nothing.
func Refusals(id string) ([]Refusal, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	// nftables' errors of a missing table do not wrap ENOENT: it is looked
	// for first.
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	i := slices.IndexFunc(ts, func(t *nftables.Table) bool { return t.Name == TableName(id) })
	if i < 0 {
		return nil, nil
	}
	set := &nftables.Set{Table: ts[i], Name: setRefused, KeyType: refusedType}
	elems, err := c.GetSetElements(set)
	if err != nil {
		return nil, fmt.Errorf("read the refusals of table %s: %w", TableName(id), err)
	}
	var out []Refusal
	for _, e := range elems {
		if len(e.Key) < 12 {
			continue
		}
		r := Refusal{Destination: netip.AddrFrom4([4]byte(e.Key[:4])), Protocol: protoName(e.Key[4])}
		if r.Protocol == "tcp" || r.Protocol == "udp" {
			r.Port = binary.BigEndian.Uint16(e.Key[8:10])
		}
		if e.Counter != nil {
			r.Count = e.Counter.Packets
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Refusal) int {
		if a.Count != b.Count {
			return int(b.Count) - int(a.Count)
		}
		return a.Destination.Compare(b.Destination)
	})
	return out, nil
}

func protoName(p byte) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	}
	return fmt.Sprint(p)
}
