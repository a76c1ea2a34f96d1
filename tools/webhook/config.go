package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/schema"
)

// Config is one entry of the "tools" array of a webhook config file
// (the format is described at Load).
type Config struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Contract    string            `json:"contract"`
	Parameters  json.RawMessage   `json:"parameters"`
	URL         string            `json:"url"`
	StatusURL   string            `json:"status_url,omitempty"`
	Timeout     string            `json:"timeout,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// webhookFields are the fields of a tool entry, in the order their errors
// are reported.
var webhookFields = []string{"name", "description", "contract", "parameters", "url", "status_url", "timeout", "headers"}

var webhookName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// reservedHeaders are set by the gateway (or by net/http) on every call.
var reservedHeaders = map[string]bool{
	"Content-Type": true, "Idempotency-Key": true, "Content-Length": true,
	"Host": true, "Transfer-Encoding": true, "Connection": true, "Te": true,
	"Trailer": true, "Upgrade": true, "Keep-Alive": true, "Proxy-Connection": true,
}

// Load reads the webhook config file at path and returns its tools
// in file order: a *Runner for a cancellable or idempotent tool, a
// *Committer for a consequential one. client makes the calls (nil:
// a default client); the per-call timeout comes from the config, and
// redirects are never followed. Every problem found is reported, each
// naming the tool and the field.
//
// The file:
//
//	{
//	  "tools": [
//	    {
//	      "name": "lookup_order",                      // ^[a-z][a-z0-9_]{0,63}$, unique
//	      "description": "Look an order up by id.",   // for the model; required
//	      "contract": "idempotent",                    // cancellable | idempotent | consequential
//	      "parameters": {"type": "object", ...},       // JSON Schema, see schema.Compile
//	      "url": "https://orders.example.com/lookup",  // http or https; POSTed to
//	      "status_url": "https://…/status/{key}",      // consequential only, optional
//	      "timeout": "10s",                            // optional, default 10s, at most 10m
//	      "headers": {"Authorization": "Bearer ${ORDERS_TOKEN}"} // optional
//	    }
//	  ],
//	  "mcp_servers": [...]                             // optional: MCP servers, see package mcp
//	}
//
// Every field but status_url, timeout and headers is required; unknown
// fields, duplicate keys and duplicate tool names are errors. A header
// value may reference environment variables as ${NAME} (letters, digits
// and "_", not starting with a digit), so secrets stay out of the file; a
// variable that is unset or empty is an error at load time. Header values
// are never logged nor put in error messages. A "$" not followed by "{" is
// kept as is. The headers Content-Type, Idempotency-Key, Content-Length,
// Host and the hop-by-hop headers are set by the gateway and cannot be
// configured. The url must not carry credentials (user:password@); put
// them in a header. Error messages show urls without their query string.
//
// A call is `POST url` with the body {"arguments": <normalised
// arguments>} and the headers Content-Type: application/json,
// Idempotency-Key: <key>, Accept: application/json and the configured
// ones. A 2xx answer's body, which must be JSON of at most 1 MiB, is the
// result (compacted). Redirects are not followed (a 3xx is an error): a
// redirect would resend the configured headers, secrets included, to
// wherever it points.
//
// Contracts:
//
//   - cancellable and idempotent tools are Runners (*Runner). Run
//     honours ctx at once: a cancel aborts the request.
//   - consequential tools are Committers (*Committer). Prepare's
//     preview is the normalised arguments and its key is
//     "<name>:<scope>:<16 hex of sha256(normalised arguments)>:commit".
//     Commit sends that key as Idempotency-Key; the service must act at
//     most once per key and answer a repeated key with the first outcome.
//     A 4xx answer other than 408, 409 and 429 means the service refused
//     and did nothing: the error wraps tools.ErrRejected. A 408, 409 (the usual
//     answer to a key whose first request is still in progress), 429, 3xx
//     or 5xx answer, a timeout, a network error or a 2xx whose body is not
//     JSON leaves the outcome unknown (a plain error).
//     Status GETs status_url with every "{key}" replaced by the key
//     (escaped for the path, or for the query when the placeholder is after
//     "?"): 200 with a JSON body means the service acted on the key
//     (Known, Result = body); 404 means it has not acted on it yet, which
//     is not proof that it never will (a service may record a key only
//     when it finishes acting): the outcome stays unknown, and the gateway
//     keeps asking until the reconcile horizon; anything else is an error.
//     What a status endpoint must guarantee: 200 only for a key that
//     acted, with the same result a repeated POST would return; never 404
//     for a key that acted. Without status_url an outcome left unknown (a
//     lost answer, a crash) cannot be reconciled: Status returns an error
//     and the outcome stays unknown (a retried Commit is then safe only
//     because the service honours Idempotency-Key), so configure
//     status_url for every consequential tool whose service can look a key
//     up.
func Load(path string, client *http.Client) ([]tools.Tool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("webhook config: %w", err)
	}
	ts, err := Parse(data, client)
	if err != nil {
		return nil, fmt.Errorf("webhook config %s: %w", path, err)
	}
	return ts, nil
}

// Parse is Load on the file's content.
func Parse(data []byte, client *http.Client) ([]tools.Tool, error) {
	if err := checkJSONDocument(data); err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, errors.New(`the file must hold one JSON object, {"tools": [...]}`)
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if k != "tools" && k != tools.MCPServersField {
			errs = append(errs, fmt.Errorf(`unknown field %q (the file holds "tools" and %q)`, k, tools.MCPServersField))
		}
	}
	rawTools, ok := top["tools"]
	if !ok {
		if _, mcp := top[tools.MCPServersField]; mcp && len(errs) == 0 {
			return []tools.Tool{}, nil // only MCP servers: package mcp reads them
		}
		errs = append(errs, fmt.Errorf(`field "tools" is missing (give "tools", %q, or both)`, tools.MCPServersField))
		return nil, errors.Join(errs...)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(rawTools, &entries); err != nil || entries == nil {
		errs = append(errs, errors.New(`field "tools" must be an array of tool objects`))
		return nil, errors.Join(errs...)
	}
	var out []tools.Tool
	seen := map[string]int{}
	for i, raw := range entries {
		cfg, label, ferrs, ok := decodeWebhookEntry(i, raw)
		if ok {
			if first, dup := seen[cfg.Name]; dup && cfg.Name != "" {
				ferrs = append(ferrs, fmt.Errorf(`field "name": %q is already the name of tools[%d]`, cfg.Name, first))
			} else if !dup {
				seen[cfg.Name] = i
			}
			t, err := newWebhook(cfg, client)
			switch {
			case err != nil:
				ferrs = append(ferrs, splitJoined(err)...)
			case len(ferrs) == 0:
				out = append(out, t)
			}
		}
		for _, e := range ferrs {
			errs = append(errs, fmt.Errorf("%s: %w", label, e))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if out == nil {
		out = []tools.Tool{}
	}
	return out, nil
}

// decodeWebhookEntry decodes tools[i] field by field, so that every error
// names its field. label names the entry in messages. ok reports whether
// every field had the right JSON type (unknown fields aside), so that cfg
// can be checked further.
func decodeWebhookEntry(i int, raw json.RawMessage) (cfg Config, label string, errs []error, ok bool) {
	label = fmt.Sprintf("tools[%d]", i)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return cfg, label, []error{errors.New("must be a JSON object")}, false
	}
	if n, found := fields["name"]; found && json.Unmarshal(n, &cfg.Name) == nil && cfg.Name != "" {
		label = fmt.Sprintf("tool %q (tools[%d])", cfg.Name, i)
	}
	known := map[string]bool{}
	for _, f := range webhookFields {
		known[f] = true
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !known[k] {
			errs = append(errs, fmt.Errorf("unknown field %q (known: %s)", k, strings.Join(webhookFields, ", ")))
		}
	}
	ok = true
	str := func(name string, dst *string) {
		if v, found := fields[name]; found {
			if err := json.Unmarshal(v, dst); err != nil || string(bytes.TrimSpace(v)) == "null" {
				errs = append(errs, fmt.Errorf("field %q must be a string", name))
				ok = false
			}
		}
	}
	str("name", &cfg.Name)
	str("description", &cfg.Description)
	str("contract", &cfg.Contract)
	cfg.Parameters = fields["parameters"]
	str("url", &cfg.URL)
	str("status_url", &cfg.StatusURL)
	str("timeout", &cfg.Timeout)
	if v, found := fields["headers"]; found {
		if err := json.Unmarshal(v, &cfg.Headers); err != nil || cfg.Headers == nil {
			errs = append(errs, errors.New(`field "headers" must be an object of strings, e.g. {"Authorization": "Bearer ${TOKEN}"}`))
			ok = false
		}
	}
	return cfg, label, errs, ok
}

// New checks cfg as Load does and returns its tool: a
// *Runner or a *Committer. ${NAME} references in header
// values are expanded now.
func New(cfg Config, client *http.Client) (tools.Tool, error) {
	t, err := newWebhook(cfg, client)
	if err != nil {
		label := "webhook tool"
		if cfg.Name != "" {
			label = fmt.Sprintf("webhook tool %q", cfg.Name)
		}
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	return t, nil
}

// newWebhook returns the tool or an errors.Join of every problem, each
// naming its field.
func newWebhook(cfg Config, client *http.Client) (tools.Tool, error) {
	var errs []error
	fail := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("field %q: %s", field, fmt.Sprintf(format, a...)))
	}

	switch {
	case cfg.Name == "":
		fail("name", "is required")
	case !webhookName.MatchString(cfg.Name):
		fail("name", "%q must match ^[a-z][a-z0-9_]{0,63}$ (lower-case letters, digits and _, starting with a letter)", cfg.Name)
	}
	switch {
	case strings.TrimSpace(cfg.Description) == "":
		fail("description", "is required: the model reads it to decide when to call the tool")
	case len(cfg.Description) > maxDescriptionBytes:
		fail("description", "is longer than %d bytes", maxDescriptionBytes)
	case !utf8.ValidString(cfg.Description):
		fail("description", "is not valid UTF-8")
	}
	switch cfg.Contract {
	case tools.Cancellable, tools.Idempotent, tools.Consequential:
	case "":
		fail("contract", "is required: cancellable, idempotent or consequential")
	default:
		fail("contract", "%q is not one of cancellable, idempotent, consequential", cfg.Contract)
	}
	var params *schema.Schema
	if len(bytes.TrimSpace(cfg.Parameters)) == 0 {
		fail("parameters", `is required: a JSON Schema such as {"type": "object", "properties": {...}}`)
	} else {
		s, err := schema.Compile(cfg.Parameters)
		if err != nil {
			fail("parameters", "%v", err)
		}
		params = s
	}

	h := &webhook{name: cfg.Name, contract: cfg.Contract, timeout: DefaultTimeout, headers: http.Header{}}
	if cfg.URL == "" {
		fail("url", "is required")
	} else if u, err := checkWebhookURL(cfg.URL); err != nil {
		fail("url", "%v", err)
	} else {
		h.url, h.shown = cfg.URL, shownURL(u)
	}
	if cfg.StatusURL != "" {
		if cfg.Contract != tools.Consequential && cfg.Contract != "" {
			fail("status_url", "is only used by consequential tools (this one is %s)", cfg.Contract)
		} else if err := checkStatusURL(cfg.StatusURL); err != nil {
			fail("status_url", "%v", err)
		} else {
			h.statusURL = cfg.StatusURL
		}
	}
	if cfg.Timeout != "" {
		d, err := time.ParseDuration(cfg.Timeout)
		switch {
		case err != nil:
			fail("timeout", "%q is not a duration such as \"10s\" or \"1m30s\"", cfg.Timeout)
		case d <= 0:
			fail("timeout", "%q must be positive", cfg.Timeout)
		case d > MaxTimeout:
			fail("timeout", "%q is longer than the maximum, %s", cfg.Timeout, MaxTimeout)
		default:
			h.timeout = d
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		field := "headers." + name
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			fail(field, "is not a valid header name")
			continue
		case reservedHeaders[canon]:
			fail(field, "is set by the gateway and cannot be configured")
			continue
		case h.headers[canon] != nil:
			fail(field, "is the same header as another entry (header names ignore case)")
			continue
		}
		// Never echo the value: it may be, or hold, a secret.
		v, err := tools.ExpandEnvRefs(cfg.Headers[name])
		if err != nil {
			fail(field, "%v", err)
			continue
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			fail(field, "the value (after ${NAME} expansion) holds a control character")
			continue
		}
		h.headers[canon] = []string{v}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	st, err := schema.NewTool(tools.Spec{Name: cfg.Name, Description: cfg.Description, Contract: cfg.Contract}, params.JSON())
	if err != nil {
		return nil, errors.Join(err)
	}
	h.client = noRedirectClient(client)
	if cfg.Contract == tools.Consequential {
		return &Committer{Tool: st, hook: h}, nil
	}
	return &Runner{Tool: st, hook: h}, nil
}

// splitJoined returns the errors joined in err (by errors.Join).
func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func checkWebhookURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the url itself may hold a secret in its query
		}
		return nil, fmt.Errorf("is not a valid URL: %v", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("must start with http:// or https:// (scheme %q)", u.Scheme)
	case u.Opaque != "" || u.Host == "":
		return nil, errors.New("has no host")
	case u.User != nil:
		return nil, errors.New("must not hold credentials (user:password@); put them in a header as ${NAME}")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, errors.New("must not have a #fragment")
	}
	return u, nil
}

const keyPlaceholder = "{key}"

func checkStatusURL(raw string) error {
	if !strings.Contains(raw, keyPlaceholder) {
		return errors.New(`must hold the placeholder {key}, e.g. "https://api.example.com/actions/{key}"`)
	}
	const marker = "keyplaceholder0"
	u, err := checkWebhookURL(strings.ReplaceAll(raw, keyPlaceholder, marker))
	if err != nil {
		return err
	}
	if strings.Contains(u.Host, marker) {
		return errors.New("{key} must be in the path or the query, not in the host")
	}
	return nil
}

// shownURL is u without query nor fragment, for messages.
func shownURL(u *url.URL) string {
	v := *u
	v.RawQuery, v.ForceQuery, v.Fragment, v.RawFragment = "", false, "", ""
	return v.String()
}

// checkJSONDocument reports a syntax error (with its line and column),
// trailing data, or a key that appears twice in one object (which
// encoding/json would silently resolve to the last).
func checkJSONDocument(data []byte) error {
	type frame struct {
		obj       bool
		path      string
		keys      map[string]bool
		expectKey bool
		key       string
		index     int
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	done := false
	childPath := func() string {
		if len(stack) == 0 {
			return ""
		}
		top := stack[len(stack)-1]
		if top.obj {
			if top.path == "" {
				return top.key
			}
			return top.path + "." + top.key
		}
		return fmt.Sprintf("%s[%d]", top.path, top.index)
	}
	valueDone := func() {
		if len(stack) == 0 {
			done = true
			return
		}
		top := stack[len(stack)-1]
		if top.obj {
			top.expectKey = true
		} else {
			top.index++
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if !done {
				return errors.New("the file is empty: it must hold a JSON object")
			}
			return nil
		}
		if err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) {
				line, col := lineCol(data, se.Offset)
				return fmt.Errorf("not valid JSON at line %d, column %d: %v", line, col, se)
			}
			return fmt.Errorf("not valid JSON: %v", err)
		}
		if done {
			return errors.New("not valid JSON: there is more after the top-level object")
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].expectKey {
			top := stack[n-1]
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
				valueDone()
				continue
			}
			k, _ := tok.(string)
			if top.keys[k] {
				where := "the top-level object"
				if top.path != "" {
					where = top.path
				}
				return fmt.Errorf("key %q appears twice in %s", k, where)
			}
			top.keys[k], top.key, top.expectKey = true, k, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, path: childPath(), keys: map[string]bool{}, expectKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{path: childPath()})
		case json.Delim(']'), json.Delim('}'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

func lineCol(data []byte, off int64) (line, col int) {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1)
	return line, col
}
