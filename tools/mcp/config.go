package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/honestcancel/gateway/tools"
)

// ServerConfig is one entry of the "mcp_servers" array of the tools config
// file. Exactly one of Command (stdio) and URL (Streamable HTTP) is set.
//
//	{
//	  "name": "files",                          // ^[a-z][a-z0-9_]{0,31}$, unique; tools are "files__<tool>"
//	  "command": "node", "args": ["server.js"], // stdio: the child process
//	  "env": {"ROOT": "${FILES_ROOT}"},         // stdio: its environment (only these, plus PATH and HOME)
//	  "url": "https://mcp.example.com/mcp",     // Streamable HTTP
//	  "headers": {"Authorization": "Bearer ${MCP_TOKEN}"}, // HTTP: values from the environment
//	  "headers_file": "/run/secrets/mcp-headers",          // HTTP: "Name: value" lines
//	  "contracts": {"write_file": "consequential"},        // per tool, overrides the annotations
//	  "hide": ["delete_file"],                  // tools never offered to the model
//	  "timeout": "30s"                          // connect and list; default 30s
//	}
//
// A value in env and headers may reference environment variables as
// ${NAME}; a variable that is unset or empty is an error. Secrets belong in
// the environment or in headers_file, never in a flag; header values are
// never logged.
type ServerConfig struct {
	Name        string            `json:"name"`
	Command     string            `json:"command,omitempty"`
	Args        []string          `json:"args,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	URL         string            `json:"url,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	HeadersFile string            `json:"headers_file,omitempty"`
	Contracts   map[string]string `json:"contracts,omitempty"`
	Hide        []string          `json:"hide,omitempty"`
	Timeout     string            `json:"timeout,omitempty"`
}

var (
	serverName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
)

// defaultTimeout bounds connecting and listing the tools.
const defaultTimeout = 30 * time.Second

// ParseFile returns the MCP servers of a tools config file's content: its
// "mcp_servers" array (none when the file has no such field). The rest of
// the file is package webhook's (webhook.Parse checks the whole document).
func ParseFile(data []byte) ([]ServerConfig, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, errors.New(`the file must hold one JSON object`)
	}
	raw, ok := top[tools.MCPServersField]
	if !ok {
		return nil, nil
	}
	return ParseServers(raw)
}

// ParseServers decodes and checks the "mcp_servers" array; every problem
// found is reported, naming the entry and the field.
func ParseServers(raw json.RawMessage) ([]ServerConfig, error) {
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, errors.New(`"mcp_servers" must be an array of server objects`)
	}
	var out []ServerConfig
	var errs []error
	seen := map[string]bool{}
	for i, e := range entries {
		var c ServerConfig
		dec := json.NewDecoder(bytes.NewReader(e))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			errs = append(errs, fmt.Errorf("mcp_servers[%d]: %w", i, err))
			continue
		}
		label := fmt.Sprintf("mcp_servers[%d]", i)
		if c.Name != "" {
			label += fmt.Sprintf(" (%s)", c.Name)
		}
		for _, err := range c.check() {
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
		}
		if seen[c.Name] {
			errs = append(errs, fmt.Errorf("%s: field \"name\": another server is named %q", label, c.Name))
		}
		seen[c.Name] = true
		out = append(out, c)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// check reports every field that is wrong.
func (c ServerConfig) check() []error {
	var errs []error
	fail := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("field %q: %s", field, fmt.Sprintf(format, a...)))
	}
	if !serverName.MatchString(c.Name) {
		fail("name", "%q must match ^[a-z][a-z0-9_]{0,31}$ (its tools are named <name>__<tool>)", c.Name)
	}
	switch {
	case c.Command == "" && c.URL == "":
		fail("command", `one of "command" (stdio) and "url" (Streamable HTTP) is required`)
	case c.Command != "" && c.URL != "":
		fail("url", `give "command" (stdio) or "url" (Streamable HTTP), not both`)
	case c.URL != "":
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fail("url", "must be an http or https URL")
		} else if u.User != nil {
			fail("url", "must not carry credentials; put them in a header")
		}
		if len(c.Env) > 0 || len(c.Args) > 0 {
			fail("env", `"args" and "env" are for stdio servers ("command")`)
		}
		if _, err := c.headers(); err != nil {
			fail("headers", "%v", err)
		}
	default:
		if len(c.Headers) > 0 || c.HeadersFile != "" {
			fail("headers", `"headers" and "headers_file" are for Streamable HTTP servers ("url")`)
		}
		if _, err := c.environment(); err != nil {
			fail("env", "%v", err)
		}
	}
	for _, tool := range slices.Sorted(maps.Keys(c.Contracts)) {
		switch c.Contracts[tool] {
		case tools.Cancellable, tools.Idempotent, tools.Consequential:
		default:
			fail("contracts", "tool %q: %q is not a contract (cancellable, idempotent or consequential)", tool, c.Contracts[tool])
		}
	}
	for _, tool := range c.Hide {
		if tool == "" {
			fail("hide", "names a tool with an empty name")
		}
		if _, ok := c.Contracts[tool]; ok {
			fail("hide", "tool %q is hidden and also given a contract; hide it or give it a contract", tool)
		}
	}
	if c.Timeout != "" {
		if d, err := time.ParseDuration(c.Timeout); err != nil || d <= 0 || d > 10*time.Minute {
			fail("timeout", "%q must be a duration like 30s, at most 10m", c.Timeout)
		}
	}
	return errs
}

// timeout bounds connecting and listing.
func (c ServerConfig) timeout() time.Duration {
	if d, err := time.ParseDuration(c.Timeout); err == nil && d > 0 {
		return d
	}
	return defaultTimeout
}

// environment is the child's environment: PATH and HOME of this process,
// then env with its references expanded.
func (c ServerConfig) environment() ([]string, error) {
	var out []string
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(c.Env)) {
		if !tools.EnvVarName.MatchString(k) {
			return nil, fmt.Errorf("%q is not a variable name", k)
		}
		v, err := tools.ExpandEnvRefs(c.Env[k])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		out = append(out, k+"="+v)
	}
	return out, nil
}

// headers are the configured headers: headers_file's lines, then headers
// with references expanded. Errors never hold a value.
func (c ServerConfig) headers() (http.Header, error) {
	h := http.Header{}
	if c.HeadersFile != "" {
		data, err := os.ReadFile(c.HeadersFile)
		if err != nil {
			return nil, fmt.Errorf("headers_file: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok || strings.TrimSpace(k) == "" {
				return nil, fmt.Errorf("headers_file line %d is not \"Name: value\"", n)
			}
			h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(c.Headers)) {
		v, err := tools.ExpandEnvRefs(c.Headers[k])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		h.Set(k, v)
	}
	return h, nil
}
