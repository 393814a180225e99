package pipcache_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

func ExampleParseFilename() {
	f, err := pipcache.ParseFilename("Typing_Extensions-4.12.2-py3-none-any.whl")
	if err != nil {
		panic(err)
	}
	fmt.Println(f.Name(), f.Version, f.Python, f.ABI, f.Platform)
	_, err = pipcache.ParseFilename("../evil-1.0-py3-none-any.whl")
	fmt.Println(err != nil)
	// Output:
	// typing-extensions 4.12.2 py3 none any
	// true
}

func ExampleCache_Add() {
	dir, _ := os.MkdirTemp("", "pipcache-example-")
	defer os.RemoveAll(dir)
	cache, err := pipcache.Open(filepath.Join(dir, "cache"), nil)
	if err != nil {
		panic(err)
	}
	whl := filepath.Join(dir, wheeltest.Filename("hello", "1.0"))
	os.WriteFile(whl, wheeltest.Build("hello", "1.0", map[string]string{"hello.py": "X = 1\n"}), 0o600)
	added, err := cache.Add(context.Background(), []string{whl})
	if err != nil {
		panic(err)
	}
	fmt.Println(added[0].Filename, added[0].Name, added[0].Version)
	fmt.Println(pipcache.SandboxEnv("/dev/.flmbox/wheels", false))
	// Output:
	// hello-1.0-py3-none-any.whl hello 1.0
	// [PIP_FIND_LINKS=/dev/.flmbox/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_INDEX=1]
}
