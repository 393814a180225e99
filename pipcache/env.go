package pipcache

// SandboxEnv returns the environment that makes pip in a sandbox use the
// cache's WheelsDir, mounted read-only at dir:
//
//   - PIP_FIND_LINKS=dir: pip finds wheels there, besides any index;
//   - PIP_NO_INDEX=1 when the sandbox has no network (online false): pip
//     installs from the cache alone, and a requirement the cache cannot
//     satisfy fails at once ("No matching distribution found") instead of
//     retrying an unreachable index;
//   - PIP_DISABLE_PIP_VERSION_CHECK=1 and PIP_NO_INPUT=1: pip never asks
//     an index about itself, nor a user anything.
//
// With network, pip chooses among the cache's and the index's wheels by
// version and tags; for the same version and tags, pip 23 takes the
// index's copy, so the cache then helps only when the index lacks the wheel
// or is unreachable.
func SandboxEnv(dir string, online bool) []string {
	env := []string{"PIP_FIND_LINKS=" + dir, "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1"}
	if !online {
		env = append(env, "PIP_NO_INDEX=1")
	}
	return env
}
