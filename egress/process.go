package egress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/procmem"
)

// ResolverName is the resolver binary's file name (cmd/flmbox-resolver).
const ResolverName = "flmbox-resolver"

// resolverStart bounds the wait for a new resolver to listen.
const resolverStart = 10 * time.Second

// Resolver is the files of one sandbox's resolver process, all in the
// sandbox's directory.
type Resolver struct {
	// Config is its configuration (ResolverConfig, JSON).
	Config string
	// Log is where it writes what goes wrong.
	Log string
}

// Start writes cfg and starts bin serving it, in a session of its own (no
// signal of its starter's terminal reaches it), and returns once it
// listens. A resolver that does not listen is killed.
func (r Resolver) Start(ctx context.Context, bin string, cfg ResolverConfig) (err error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(r.Config, b, 0o600); err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	logf, err := os.OpenFile(r.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, r.Config)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	go cmd.Wait() // reaped here if its starter lives on; by init if not
	defer func() {
		if err != nil {
			cmd.Process.Kill()
		}
	}()
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	t := time.NewTimer(resolverStart)
	defer t.Stop()
	select {
	case err := <-ready:
		if err != nil {
			b, _ := os.ReadFile(r.Log)
			return fmt.Errorf("start the sandbox's resolver: %v: %s", err, lastLine(b))
		}
		return nil
	case <-t.C:
		return fmt.Errorf("start the sandbox's resolver: not listening after %v", resolverStart)
	case <-ctx.Done():
		return fmt.Errorf("start the sandbox's resolver: %w", ctx.Err())
	}
}

func lastLine(b []byte) string {
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return string(b)
}

// Stop kills every process that serves the resolver's configuration, and
// waits until they are gone. It finds them by their command line, not by a
// pid that a killed starter may not have written.
func (r Resolver) Stop() error {
	mine := func(cmdline []string) bool {
		return len(cmdline) == 2 && filepath.Base(cmdline[0]) == ResolverName && cmdline[1] == r.Config
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		pids, err := procmem.Matching(mine)
		if err != nil {
			return fmt.Errorf("stop the sandbox's resolver: %w", err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stop the sandbox's resolver: processes %v still run", pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
