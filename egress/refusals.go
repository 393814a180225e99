package egress

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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
	c, t, done, err := sandboxTable(id)
	if err != nil {
		return nil, err
	}
	defer done()
	if t == nil {
		return nil, nil
	}
	set := &nftables.Set{Table: t, Name: setRefused, KeyType: refusedType}
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

// Classes of what a sandbox's table refuses: each refusing rule's comment
// names one, and its counter never saturates, where the set of refused
// destinations keeps refusedSize of them (5,000 ports scanned filled it,
// and a later refusal to the metadata service no longer showed).
const (
	ClassDenied       = "denied"         // a --deny rule: a range, or a name's port
	ClassMetadata     = "metadata"       // link-local, the cloud's metadata and host agent endpoints
	ClassPrivate      = "private"        // private and shared ranges
	ClassLoopback     = "loopback"       // 127.0.0.0/8
	ClassReserved     = "reserved"       // the other reserved ranges: this network, multicast, ...
	ClassNotAllowed   = "not allowed"    // no rule and no answer opened it
	ClassTooManyFlows = "too many flows" // over maxFlows connections at once
	ClassHost         = "host"           // the host's own addresses and services
	ClassIPv6         = "ipv6"           // any IPv6 packet
)

// reservedClass is the class of refusals to p, a range of Reserved.
func reservedClass(p netip.Prefix) string {
	switch {
	case p.Overlaps(netip.MustParsePrefix("169.254.0.0/16")) || p == netip.MustParsePrefix("168.63.129.16/32"):
		return ClassMetadata
	case p.Overlaps(netip.MustParsePrefix("127.0.0.0/8")):
		return ClassLoopback
	case slices.ContainsFunc([]string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}, func(s string) bool {
		return p.Overlaps(netip.MustParsePrefix(s))
	}):
		return ClassPrivate
	}
	return ClassReserved
}

// ruleComment is nftables' user data of a rule's comment (what `nft list`
// shows as comment "..."): attribute NFTNL_UDATA_RULE_COMMENT, its length
// and the text ending in NUL. Nothing for "".
func ruleComment(s string) []byte {
	if s == "" {
		return nil
	}
	return append([]byte{0, byte(len(s) + 1)}, append([]byte(s), 0)...)
}

// commentOf is the comment in a rule's user data, "" if none.
func commentOf(ud []byte) string {
	for len(ud) >= 2 && int(ud[1])+2 <= len(ud) {
		typ, val := ud[0], ud[2:2+int(ud[1])]
		if typ == 0 {
			return strings.TrimSuffix(string(val), "\x00")
		}
		ud = ud[2+int(ud[1]):]
	}
	return ""
}

// RefusalClass counts the packets refused of one class (Class*).
type RefusalClass struct {
	Class string `json:"class"`
	Count uint64 `json:"count"`
}

// RefusalClasses reads what the sandbox whose runsc ID is id has refused,
// by class, most refused first: counters that never saturate (Refusals
// keeps refusedSize destinations), and never go down: with counts, the
// file of its Network.Counts, what its earlier tables counted is added,
// and what its table counted so far is booked. Classes with no refusal are
// left out; a sandbox without a table has refused what its book says.
func RefusalClasses(id, counts string) ([]RefusalClass, error) {
	current, err := classCounts(id)
	if errors.Is(err, errNoTable) {
		current, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	totals := current
	if counts != "" {
		b := readBook(counts)
		if b.see(current) {
			b.write(counts) // a book not written now is written by a later read
		}
		totals = b.total(current)
	}
	var out []RefusalClass
	for class, n := range totals {
		if n > 0 {
			out = append(out, RefusalClass{class, n})
		}
	}
	slices.SortFunc(out, func(a, b RefusalClass) int {
		if a.Count != b.Count {
			return cmp.Compare(b.Count, a.Count)
		}
		return strings.Compare(a.Class, b.Class)
	})
	return out, nil
}

// errNoTable: the sandbox has no table.
var errNoTable = errors.New("the sandbox has no nftables table")

// classCounts reads the counters of the refusing rules of the sandbox's
// table, by class.
func classCounts(id string) (map[string]uint64, error) {
	c, t, done, err := sandboxTable(id)
	if err != nil {
		return nil, err
	}
	defer done()
	if t == nil {
		return nil, errNoTable
	}
	counts := map[string]uint64{}
	for _, chain := range []string{chainOut, chainFull, "input"} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
		if err != nil {
			return nil, fmt.Errorf("read the refusals of table %s: %w", TableName(id), err)
		}
		for _, r := range rules {
			class := commentOf(r.UserData)
			if class == "" {
				continue
			}
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok && ctr.Packets > 0 {
					counts[class] += ctr.Packets
				}
			}
		}
	}
	return counts, nil
}

// sandboxTable opens nftables in the router and finds the table of the
// sandbox whose runsc ID is id: nil if it has none, or there is no router
// (nftables' errors of a missing table do not wrap ENOENT: it is looked for
// first). The caller calls done once it no longer uses the connection.
func sandboxTable(id string) (_ *nftables.Conn, _ *nftables.Table, done func(), err error) {
	r, err := openRouter()
	if errors.Is(err, ErrGone) {
		return nil, nil, func() {}, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := r.nft()
	if err != nil {
		r.Close()
		return nil, nil, nil, err
	}
	t, err := inetTable(c, TableName(id))
	return c, t, r.Close, err
}
