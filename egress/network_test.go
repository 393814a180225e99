package egress

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
)

// inPrivateNetNS runs the calling test again in a network namespace of its
// own (unshare -n), and a mount namespace of its own (its namespaces' bind
// mounts go with it), so that nothing it makes touches the host's network,
// and reports whether this is that run.
func inPrivateNetNS(t *testing.T) bool {
	t.Helper()
	if os.Getenv("EGRESS_TEST_NETNS") == t.Name() {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	cmd := exec.Command("unshare", "--net", "--mount", "--", os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), "EGRESS_TEST_NETNS="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in a network namespace of its own: %v\n%s", err, out)
	}
	return false
}

func tables(t *testing.T) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range ts {
		names = append(names, x.Name)
	}
	return names
}

func links(t *testing.T) []string {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// routerNft opens nftables in the egress router.
func routerNft(t *testing.T) *nftables.Conn {
	t.Helper()
	r, err := openRouter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	c, err := r.nft()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// routerTables are the tables in the egress router, none if there is none.
func routerTables(t *testing.T) []string {
	t.Helper()
	if !routerThere(t) {
		return nil
	}
	ts, err := routerNft(t).ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range ts {
		names = append(names, x.Name)
	}
	slices.Sort(names)
	return names
}

// routerLinks are the sandboxes' links in the egress router.
func routerLinks(t *testing.T) []string {
	t.Helper()
	if !routerThere(t) {
		return nil
	}
	r, err := openRouter()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ls, err := r.sandboxLinks()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// routerThere reports whether the egress router is there.
func routerThere(t *testing.T) bool {
	t.Helper()
	p, err := RouterPath()
	if err != nil {
		t.Fatal(err)
	}
	return mountinfo.IsNsfs(p)
}

func readForward() string {
	b, _ := os.ReadFile(ipForward)
	return strings.TrimSpace(string(b))
}

func TestCreateDelete(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := "flmbox-0123456789abcdef01234567"
	ns := filepath.Join(t.TempDir(), "netns")
	p := Policy{Allow: rules("allowed.test", "198.51.100.0/24:443", "169.254.169.254"), Deny: rules("198.51.100.9")}
	n, err := Create(ctx, id, ns, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(id, ns) })
	if n.Host != HostLink(id) || !Range.Contains(n.Gateway) || n.Addr != n.Gateway.Next() {
		t.Fatalf("network %+v", n)
	}
	if !slices.Contains(routerLinks(t), n.Host) || !slices.Contains(routerTables(t), TableName(id)) ||
		!slices.Contains(tables(t), guardTable) || !slices.Contains(tables(t), natTable) || !slices.Contains(links(t), uplinkHost) {
		t.Fatalf("router's links %v, tables %v; host's links %v, tables %v", routerLinks(t), routerTables(t), links(t), tables(t))
	}
	if slices.Contains(tables(t), TableName(id)) || slices.Contains(links(t), n.Host) {
		t.Fatalf("the sandbox's link or table in the host's namespace: links %v, tables %v", links(t), tables(t))
	}
	if b, _ := os.ReadFile(ipForward); strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("forwarding is %q", b)
	}
	// A second sandbox takes the next /30.
	n2, err := Create(ctx, "flmbox-1123456789abcdef01234567", filepath.Join(t.TempDir(), "netns"), Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(n2.ID, n2.NetNS) })
	if n2.Gateway == n.Gateway || netip.PrefixFrom(n.Gateway, 30).Masked().Contains(n2.Gateway) {
		t.Fatalf("two sandboxes share a subnet: %v, %v", n.Gateway, n2.Gateway)
	}
	c := routerNft(t)
	a := netip.MustParseAddr("198.51.100.10")
	if err := pin(c, TableName(id), []netip.Addr{a}, []uint16{443}, []uint16{80}, time.Second); err != nil {
		t.Fatal(err)
	}
	set := &nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(id)}, Name: setPinPort, KeyType: pinPortType}
	elems, err := c.GetSetElements(set)
	if err != nil || len(elems) != 1 || elems[0].Timeout != minPin || elems[0].Expires <= 0 {
		t.Fatalf("pinned %+v, %v", elems, err)
	}
	if r, err := Refusals(id); err != nil || len(r) != 0 {
		t.Fatalf("refusals %v, %v", r, err)
	}
	if err := n.Configure(); err != nil { // again, as before a restore
		t.Fatal(err)
	}
	for i, x := range []*Network{n, n2} {
		if err := Delete(x.ID, x.NetNS); err != nil {
			t.Fatal(err)
		}
		// On while an egress network is left, off (as before) once the
		// last one's first Delete is done.
		if b, want := readForward(), map[int]string{0: "1", 1: "0"}[i]; b != want {
			t.Fatalf("forwarding is %q after %d of 2 egress networks went, want %q", b, i+1, want)
		}
		if err := Delete(x.ID, x.NetNS); err != nil {
			t.Fatalf("a second Delete: %v", err)
		}
	}
	if slices.ContainsFunc(links(t), func(l string) bool { return strings.HasPrefix(l, linkPrefix) }) || len(tables(t)) != 0 || routerThere(t) {
		t.Fatalf("left: links %v, tables %v, the router %v", links(t), tables(t), routerThere(t))
	}
	rules, err := netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Priority == rulePrefLocal || r.Priority == rulePrefMarked || r.Priority == rulePrefProhibit {
			t.Fatalf("routing rule left: %v", r)
		}
	}
	if b, _ := os.ReadFile(ipForward); strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("forwarding is %q after the last egress network went, want 0 as before", b)
	}
	if _, err := os.Stat(ns); !os.IsNotExist(err) {
		t.Fatalf("namespace file left: %v", err)
	}
	if r, err := Refusals(id); err != nil || r != nil {
		t.Fatalf("refusals of a deleted table: %v, %v", r, err)
	}
}

// TestPrune: a table whose link is gone is deleted; a table with its link,
// and other tables, are left; the router goes with its last link, and
// forwarding is restored.
func TestPrune(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	ctx := context.Background()
	live := "flmbox-2123456789abcdef01234567"
	n, err := Create(ctx, live, filepath.Join(t.TempDir(), "netns"), Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(n.ID, n.NetNS) })
	c := routerNft(t)
	orphan := "flmbox-3123456789abcdef01234567"
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: orphan})
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "someone-elses"})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := routerTables(t), []string{live, "someone-elses"}; !slices.Equal(got, want) {
		t.Fatalf("tables after Prune: %v, want %v", got, want)
	}
	// The namespace goes without Delete (its veth with it): Prune deletes
	// the table, and the router and forwarding go with the last link.
	if err := unix.Unmount(n.NetNS, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); slices.Contains(routerLinks(t), n.Host); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("link %s outlives its namespace", n.Host)
		}
	}
	if err := Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if routerThere(t) || len(tables(t)) != 0 || slices.Contains(links(t), uplinkHost) {
		t.Fatalf("after the namespace went: the router %v, host's tables %v, links %v", routerThere(t), tables(t), links(t))
	}
	if b, _ := os.ReadFile(ipForward); strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("forwarding is %q", b)
	}
}

// TestForwardingAfterAFlush: a flush of the host's ruleset takes the guard
// and masquerade tables (not the sandboxes', which are in the router);
// Ensure makes them again, and the last egress network's Delete turns
// forwarding off all the same.
func TestForwardingAfterAFlush(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	flush := func() {
		t.Helper()
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		c.FlushRuleset()
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	p := Policy{Allow: rules("allowed.test")}
	for _, ensure := range []bool{true, false} {
		id := "flmbox-2123456789abcdef01234567"
		n, err := Create(ctx, id, filepath.Join(t.TempDir(), "netns"), p)
		if err != nil {
			t.Fatal(err)
		}
		flush()
		if ensure {
			if _, err := n.Ensure(ctx, p); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(tables(t), guardTable) || !slices.Contains(tables(t), natTable) || !slices.Contains(routerTables(t), TableName(id)) {
				t.Fatalf("tables after Ensure: host's %v, router's %v", tables(t), routerTables(t))
			}
		}
		if err := Delete(n.ID, n.NetNS); err != nil {
			t.Fatal(err)
		}
		if got := readForward(); got != "0" {
			t.Fatalf("forwarding is %q after the last egress network went (Ensure %v), want 0 as before", got, ensure)
		}
		if len(tables(t)) != 0 {
			t.Fatalf("left: tables %v", tables(t))
		}
	}
	// Forwarding on before flmbox stays on, with no guard.
	if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := Create(ctx, "flmbox-3123456789abcdef01234567", filepath.Join(t.TempDir(), "netns"), p)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(tables(t), guardTable) {
		t.Fatalf("a guard where forwarding was on: %v", tables(t))
	}
	flush()
	if _, err := n.Ensure(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := Delete(n.ID, n.NetNS); err != nil {
		t.Fatal(err)
	}
	if got := readForward(); got != "1" || len(tables(t)) != 0 {
		t.Fatalf("forwarding %q, tables %v; want on as before, no table", got, tables(t))
	}
}
