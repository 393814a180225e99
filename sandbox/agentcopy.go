package sandbox

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/stateroot"
)

// agentCopy returns the agent binary that new sandboxes bind:
// ROOT/agents/ID/flmbox-agent, a copy of agent made once per build (ID:
// its size and modification time). A suspended sandbox is restored on the
// very binary it ran (gVisor reads its code pages again from the host
// file): an flmbox upgraded meanwhile must not change it.
func (m *Manager) agentCopy(agent string) (string, error) {
	fi, err := os.Stat(agent)
	if err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	dir := filepath.Join(stateroot.Agents(m.root), agentID(fi))
	dst := filepath.Join(dir, AgentName)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("copy the agent: %w", err)
	}
	src, err := os.Open(agent)
	if err != nil {
		return "", fmt.Errorf("copy the agent: %w", err)
	}
	defer src.Close()
	// Another process's copy of the same build may win: the same bytes.
	if err := atomicfile.WriteFrom(dst, src, 0o755); err != nil {
		return "", fmt.Errorf("copy the agent: %w", err)
	}
	return dst, nil
}
