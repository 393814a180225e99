package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
)

// A tool answers a call from its args, a JSON object (never empty).
type tool func(args json.RawMessage) (any, error)

// tools are the server's tools by name.
var tools = map[string]tool{
	"search":  search,
	"weather": weather,
}

// toolNames are the names of tools, sorted.
func toolNames() []string {
	names := make([]string, 0, len(tools))
	for name := range tools {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// request is a call as the client sends it.
type request struct {
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args"`
}

// call decodes a request and answers it; name is the tool's, if known.
func call(data []byte) (name string, answer any, err error) {
	var req request
	if err := json.Unmarshal(data, &req); err != nil {
		return "", nil, fmt.Errorf("bad request: %w", err)
	}
	t, ok := tools[req.Tool]
	switch {
	case req.Tool == "":
		return "", nil, errors.New(`bad request: no "tool"`)
	case !ok:
		return "", nil, fmt.Errorf("unknown tool %q (known: %s)", req.Tool, strings.Join(toolNames(), ", "))
	}
	args := bytes.TrimSpace(req.Args)
	switch {
	case len(args) == 0 || string(args) == "null":
		args = []byte("{}")
	case args[0] != '{':
		return req.Tool, nil, fmt.Errorf("%s: \"args\" must be a JSON object", req.Tool)
	}
	answer, err = t(args)
	if err != nil {
		return req.Tool, nil, fmt.Errorf("%s: %w", req.Tool, err)
	}
	return req.Tool, answer, nil
}

// searchResult is one result of search.
type searchResult struct {
	Title string `json:"title"`
	URL   string `json:"url"`
}

// searchAnswer is search's answer.
type searchAnswer struct {
	Query   string         `json:"query"`
	Results []searchResult `json:"results"`
}

// search answers {"query": Q} with three fake results about Q, from a wiki,
// a guide and a news site, in an order chosen by Q's hash.
func search(args json.RawMessage) (any, error) {
	var a struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, fmt.Errorf("bad args: %w", err)
	}
	q := strings.TrimSpace(a.Query)
	if q == "" {
		return nil, errors.New(`bad args: "query" must be a non-empty string`)
	}
	slug := slugify(q)
	sites := []searchResult{
		{q + ": overview", "https://wiki.example/" + slug},
		{q + ": a guide", "https://guide.example/" + slug},
		{q + ": latest news", "https://news.example/" + slug},
	}
	first := int(hash(q) % uint32(len(sites)))
	return searchAnswer{Query: q, Results: append(sites[first:], sites[:first]...)}, nil
}

// weatherAnswer is weather's answer.
type weatherAnswer struct {
	City       string `json:"city"`
	TempC      int    `json:"temp_c"`
	Conditions string `json:"conditions"`
}

// weather answers {"city": C} with a fake forecast: a temperature from -5
// to 35 °C chosen by C's hash, and conditions that go with it.
func weather(args json.RawMessage) (any, error) {
	var a struct {
		City string `json:"city"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, fmt.Errorf("bad args: %w", err)
	}
	c := strings.TrimSpace(a.City)
	if c == "" {
		return nil, errors.New(`bad args: "city" must be a non-empty string`)
	}
	t := int(hash(c)%41) - 5
	var cond string
	switch {
	case t >= 28:
		cond = "sunny"
	case t >= 18:
		cond = "partly cloudy"
	case t >= 8:
		cond = "cloudy"
	case t >= 2:
		cond = "rain"
	default:
		cond = "snow"
	}
	return weatherAnswer{City: c, TempC: t, Conditions: cond}, nil
}

// hash is FNV-1a of s in lower case.
func hash(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(strings.ToLower(s)))
	return h.Sum32()
}

// slugify makes s a URL path segment: lower-case letters and digits, the
// rest runs of '-', at most 64 bytes.
func slugify(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			if b.Len() >= 64 {
				break
			}
			continue
		}
		dash = true
	}
	if b.Len() == 0 {
		return "q"
	}
	return b.String()
}
