package sandbox_test

import (
	"flag"
	"os"
	"testing"
)

// withRunsc is set by the integration build (make integration), whose
// setup gives the examples a state root, runsc, the agent and the test
// image. Without it the examples only compile: they need root and runsc.
var withRunsc func() (cleanup func(), err error)

func TestMain(m *testing.M) {
	flag.Parse()
	if withRunsc == nil {
		if run := flag.Lookup("test.run"); run.Value.String() == "" {
			flag.Set("test.run", "^Test")
		}
		os.Exit(m.Run())
	}
	cleanup, err := withRunsc()
	if err != nil {
		os.Stderr.WriteString("sandbox: set up the examples: " + err.Error() + "\n")
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}
