package sandbox

import (
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
)

// The files of /etc that every container gets from its runtime, as docker,
// podman and Kubernetes write them: /etc/hosts (localhost, so that
// socket.gethostbyname("localhost") resolves, and the sandbox's host name),
// /etc/hostname, and with the host's network the host's /etc/resolv.conf.
// They are written per sandbox into its directory (etcDir) and bound
// read-only over the image's files, never into the cached tree that
// sandboxes share; the image cache makes their mount points if the image
// lacks them (mountPoints). An image that has one of them as another type
// (/etc/resolv.conf as a symlink, say) keeps its own: those mount points
// are optional, and rootfs reports them skipped.
const (
	etcHosts    = "/etc/hosts"
	etcHostname = "/etc/hostname"
	etcResolv   = "/etc/resolv.conf"
)

// A one-CPU sandbox's CPUs (see shownCPUs): what /proc/cpuinfo and
// /sys/devices/system/cpu/online say in it (glibc's sysconf, and so
// Python's os.cpu_count(), reads the second), bound over gVisor's own.
const (
	procCPUInfo  = "/proc/cpuinfo"
	sysCPUOnline = "/sys/devices/system/cpu/online"
)

// etcMountPoints are the optional mount points of the files of /etc and of
// a one-CPU sandbox's CPUs.
var etcMountPoints = []rootfs.MountPoint{
	{Path: etcHosts, Type: rootfs.MountPointFile, Optional: true},
	{Path: etcHostname, Type: rootfs.MountPointFile, Optional: true},
	{Path: etcResolv, Type: rootfs.MountPointFile, Optional: true},
	{Path: procCPUInfo, Type: rootfs.MountPointFile, Optional: true},
	{Path: sysCPUOnline, Type: rootfs.MountPointFile, Optional: true},
}

// shownCPUs is how many CPUs flmbox shows a sandbox with limits l where
// runsc would show another count, else 0. runsc shows ceil(quota) CPUs, but
// never fewer than 2 (fewer would need a cpuset of one CPU at the sandbox's
// start, and gVisor's kernel then runs on one Go thread: a warm Python call
// took 1.5 times as long), so a sandbox whose quota is one CPU or less, on a
// host of more, is shown one by flmbox itself: its agent's affinity (agent
// --cpus), which its processes inherit, and /proc/cpuinfo and
// /sys/devices/system/cpu/online bound over gVisor's (writeEtc).
func shownCPUs(l Limits) int {
	if l.CPUs > 0 && l.CPUs <= 1 && goruntime.NumCPU() > 1 {
		return 1
	}
	return 0
}

// cpuFiles returns /proc/cpuinfo and /sys/devices/system/cpu/online for a
// sandbox shown n CPUs: the host's first n processors (gVisor's own copies
// the host's model and features), numbered from 0.
func cpuFiles(n int) map[string][]byte {
	info, _ := os.ReadFile(procCPUInfo)
	var out []byte
	for i, block := range strings.SplitAfter(string(info), "\n\n") {
		if i == n || strings.TrimSpace(block) == "" {
			break
		}
		out = append(out, block...)
	}
	online := "0"
	if n > 1 {
		online = "0-" + strconv.Itoa(n-1)
	}
	return map[string][]byte{procCPUInfo: out, sysCPUOnline: []byte(online + "\n")}
}

// hostResolvConf is the host's resolver configuration, copied into
// sandboxes with the host's network.
const hostResolvConf = "/etc/resolv.conf"

// etcDir is where a sandbox's files of /etc are on the host.
func etcDir(rec *record.Record) string { return filepath.Join(rec.Dir, "etc") }

// hostname is the host name of the sandbox of rec: the first 12 hex digits
// of its runsc container's ID, as docker names a container's host (its
// name could be any of [A-Za-z0-9_.-], and a pooled sandbox takes another
// name later).
func hostname(rec *record.Record) string {
	id := strings.TrimPrefix(rec.ID, "flmbox-")
	return id[:min(12, len(id))]
}

// hostsFile is /etc/hosts for a sandbox named host: docker's lines, with
// the host name on 127.0.1.1 as Debian has it when there is no address of
// its own to give (with the host's network, the sandbox's name is not the
// host's).
func hostsFile(host string) string {
	return "127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\n" +
		"ff00::0\tip6-mcastprefix\n" +
		"ff02::1\tip6-allnodes\n" +
		"ff02::2\tip6-allrouters\n" +
		"127.0.1.1\t" + host + "\n"
}

// writeEtc writes the sandbox's files of /etc into etcDir and returns the
// spec's read-only binds of those whose mount point the image has (not
// img.Skipped; at the target of the image's symlink for img.Moved, so that
// the link leads to the sandbox's file) and that none of the caller's
// mounts covers. /etc/resolv.conf is the host's with the host's network, names
// the sandbox's resolver with egress, and is none (the image's own)
// without a network or when the host has none.
func writeEtc(rec *record.Record, img *rootfs.Result, mounts []Mount) ([]runtime.SpecOpt, error) {
	dir := etcDir(rec)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("write sandbox %q's /etc files: %w", rec.Name, err)
	}
	host := hostname(rec)
	files := map[string][]byte{etcHosts: []byte(hostsFile(host)), etcHostname: []byte(host + "\n")}
	switch Network(rec.Network) {
	case NetworkHost:
		if b, err := os.ReadFile(hostResolvConf); err == nil {
			files[etcResolv] = b
		}
	case NetworkEgress:
		files[etcResolv] = []byte("nameserver " + rec.Egress.Gateway + "\n")
	}
	if n := shownCPUs(Limits(rec.Limits)); n > 0 {
		maps.Copy(files, cpuFiles(n))
	}
	var opts []runtime.SpecOpt
	for _, mp := range etcMountPoints {
		data, ok := files[mp.Path]
		covered := slices.ContainsFunc(mounts, func(mt Mount) bool {
			d := path.Clean(mt.Destination)
			return d == mp.Path || strings.HasPrefix(mp.Path, strings.TrimSuffix(d, "/")+"/")
		})
		if !ok || covered || slices.Contains(img.Skipped, mp) {
			continue
		}
		src := filepath.Join(dir, filepath.Base(mp.Path)) // hosts, hostname, resolv.conf, cpuinfo, online
		if err := os.WriteFile(src, data, 0o644); err != nil {
			return nil, fmt.Errorf("write sandbox %q's %s: %w", rec.Name, mp.Path, err)
		}
		dst := mp.Path
		if i := slices.IndexFunc(img.Moved, func(m rootfs.Moved) bool { return m.MountPoint == mp }); i >= 0 {
			dst = img.Moved[i].To
		}
		opts = append(opts, runtime.WithBind(src, dst, true))
	}
	return append(opts, runtime.WithHostname(host)), nil
}
