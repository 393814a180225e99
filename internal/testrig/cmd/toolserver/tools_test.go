package main

import (
	"encoding/json"
	"testing"
)

func TestCall(t *testing.T) {
	tests := []struct {
		name, request string
		tool          string // the tool counted, "" for none
		answer        string // the answer as JSON, or
		err           string // the error's message
	}{
		{
			name:    "search",
			request: `{"tool": "search", "args": {"query": "gVisor sandbox"}}`,
			tool:    "search",
			answer: `{"query":"gVisor sandbox","results":[` +
				`{"title":"gVisor sandbox: latest news","url":"https://news.example/gvisor-sandbox"},` +
				`{"title":"gVisor sandbox: overview","url":"https://wiki.example/gvisor-sandbox"},` +
				`{"title":"gVisor sandbox: a guide","url":"https://guide.example/gvisor-sandbox"}]}`,
		},
		{
			name:    "search, another order",
			request: `{"tool": "search", "args": {"query": "Hanoi travel"}}`,
			tool:    "search",
			answer: `{"query":"Hanoi travel","results":[` +
				`{"title":"Hanoi travel: overview","url":"https://wiki.example/hanoi-travel"},` +
				`{"title":"Hanoi travel: a guide","url":"https://guide.example/hanoi-travel"},` +
				`{"title":"Hanoi travel: latest news","url":"https://news.example/hanoi-travel"}]}`,
		},
		{
			name:    "search, a query of punctuation, Hermes' token ignored",
			request: `{"tool": "search", "args": {"query": " ?! "}, "token": "t"}`,
			tool:    "search",
			answer: `{"query":"?!","results":[` +
				`{"title":"?!: overview","url":"https://wiki.example/q"},` +
				`{"title":"?!: a guide","url":"https://guide.example/q"},` +
				`{"title":"?!: latest news","url":"https://news.example/q"}]}`,
		},
		{
			name:    "weather",
			request: `{"tool": "weather", "args": {"city": "Hanoi"}}`,
			tool:    "weather",
			answer:  `{"city":"Hanoi","temp_c":29,"conditions":"sunny"}`,
		},
		{
			name:    "weather, case ignored",
			request: `{"tool": "weather", "args": {"city": "oslo"}}`,
			tool:    "weather",
			answer:  `{"city":"oslo","temp_c":6,"conditions":"rain"}`,
		},
		{name: "unknown tool", request: `{"tool": "terminal", "args": {}}`, err: `unknown tool "terminal" (known: search, weather)`},
		{name: "no tool", request: `{"args": {}}`, err: `bad request: no "tool"`},
		{name: "bad JSON", request: `{"tool": "search"`, err: "bad request: unexpected end of JSON input"},
		{name: "trailing garbage", request: `{"tool": "search"} {}`, err: "bad request: invalid character '{' after top-level value"},
		{name: "not an object", request: `["search"]`, err: "bad request: json: cannot unmarshal array into Go value of type main.request"},
		{name: "empty line", request: ``, err: "bad request: unexpected end of JSON input"},
		{name: "args not an object", request: `{"tool": "search", "args": "gvisor"}`, tool: "search", err: `search: "args" must be a JSON object`},
		{name: "no args", request: `{"tool": "weather"}`, tool: "weather", err: `weather: bad args: "city" must be a non-empty string`},
		{name: "empty query", request: `{"tool": "search", "args": {"query": "  "}}`, tool: "search", err: `search: bad args: "query" must be a non-empty string`},
		{
			name:    "query not a string",
			request: `{"tool": "search", "args": {"query": 7}}`,
			tool:    "search",
			err:     "search: bad args: json: cannot unmarshal number into Go struct field .query of type string",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool, answer, err := call([]byte(tt.request))
			if tool != tt.tool {
				t.Errorf("tool %q, want %q", tool, tt.tool)
			}
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(answer)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.answer {
				t.Errorf("answer\n%s\nwant\n%s", got, tt.answer)
			}
		})
	}
}

func TestSlugify(t *testing.T) {
	long := ""
	for range 40 {
		long += "ab "
	}
	for in, want := range map[string]string{
		"Hanoi travel":       "hanoi-travel",
		"  C++ / Go, 2024! ": "c-go-2024",
		"Zürich":             "z-rich",
		"???":                "q",
		long:                 "ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-ab-a", // 64 bytes
	} {
		if got := slugify(in); got != want {
			t.Errorf("slugify(%q) = %q, want %q", in, got, want)
		}
	}
}
