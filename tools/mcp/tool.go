package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/schema"
)

// NameSeparator joins a server's name and its tool's name.
const NameSeparator = "__"

// maxNameLen is the longest tool name a model provider accepts.
const maxNameLen = 64

var unsafeNameChars = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// ContractFor is a tool's contract: configured when the operator set one;
// otherwise from the annotations, which are the server's hints: readOnlyHint
// → cancellable, idempotentHint → idempotent, anything else (the spec's
// default is destructiveHint: true) → consequential.
func ContractFor(configured string, a *mcp.ToolAnnotations) string {
	switch {
	case configured != "":
		return configured
	case a == nil:
		return tools.Consequential
	case a.ReadOnlyHint:
		return tools.Cancellable
	case a.IdempotentHint:
		return tools.Idempotent
	}
	return tools.Consequential
}

// adapt turns the listed tools into the gateway's: named
// "<server>__<tool>" (characters a model provider refuses become "_"),
// contract by ContractFor, arguments checked against the input schema. A
// tool whose name collides or is too long, or whose schema does not
// compile, is left out with a warning, and so is a tool the config
// hides; a configured contract or hide entry that names no listed tool is
// a warning.
func (s *Server) adapt(listed []*mcp.Tool) []tools.Tool {
	var out []tools.Tool
	seen := map[string]bool{}
	known := map[string]bool{}
	for _, t := range listed {
		known[t.Name] = true
		if slices.Contains(s.cfg.Hide, t.Name) {
			continue
		}
		name := s.cfg.Name + NameSeparator + unsafeNameChars.ReplaceAllString(t.Name, "_")
		if len(name) > maxNameLen || seen[name] {
			s.log.Warn("MCP tool left out: its name is too long or collides once made safe", "tool", t.Name, "as", name)
			continue
		}
		raw, err := json.Marshal(t.InputSchema)
		if err != nil {
			s.log.Warn("MCP tool left out: unreadable input schema", "tool", t.Name, "err", err)
			continue
		}
		sch, err := schema.CompileExternal(raw)
		if err != nil {
			s.log.Warn("MCP tool left out: its input schema does not compile", "tool", t.Name, "err", err)
			continue
		}
		seen[name] = true
		desc := t.Description
		if desc == "" {
			desc = t.Title
		}
		base := &remoteTool{
			server: s,
			remote: t.Name,
			schema: sch,
			spec: tools.Spec{
				Name:        name,
				Description: fmt.Sprintf("%s (MCP server %s)", strings.TrimSpace(desc), s.cfg.Name),
				Contract:    ContractFor(s.cfg.Contracts[t.Name], t.Annotations),
				Parameters:  sch.JSON(),
			},
		}
		if base.spec.Contract == tools.Consequential {
			out = append(out, &Committer{remoteTool: base})
		} else {
			out = append(out, &Runner{remoteTool: base})
		}
	}
	for tool := range s.cfg.Contracts {
		if !known[tool] {
			s.log.Warn("MCP config: \"contracts\" names a tool the server does not list (misspelt, or removed by the server)", "tool", tool)
		}
	}
	for _, tool := range s.cfg.Hide {
		if !known[tool] {
			s.log.Warn("MCP config: \"hide\" names a tool the server does not list (misspelt, or removed by the server)", "tool", tool)
		}
	}
	return out
}

// remoteTool is what the two kinds of tool share.
type remoteTool struct {
	server *Server
	remote string // the tool's name at the server
	schema *schema.Schema
	spec   tools.Spec
}

// Spec implements tools.Tool.
func (t *remoteTool) Spec() tools.Spec { return t.spec }

// Validate implements tools.Tool: the arguments must fit the tool's input
// schema, as the server listed it.
func (t *remoteTool) Validate(args json.RawMessage) (json.RawMessage, error) {
	return t.schema.Validate(args)
}

// call sends tools/call with the progress token key and meta, and turns
// the answer into a result: the structured content when there is one,
// else {"content": [...]}.
func (t *remoteTool) call(ctx context.Context, key string, args json.RawMessage, meta mcp.Meta) (json.RawMessage, *mcp.CallToolResult, error) {
	cs, err := t.server.current()
	if err != nil {
		return nil, nil, err
	}
	params := &mcp.CallToolParams{Meta: meta, Name: t.remote, Arguments: args}
	params.SetProgressToken(key)
	defer t.server.watchProgress(key, tools.ProgressReporter(ctx))()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		return nil, nil, err
	}
	var body any = res.StructuredContent
	if body == nil {
		body = map[string]any{"content": res.Content}
	}
	out, err := json.Marshal(body)
	if err != nil {
		return nil, res, fmt.Errorf("unreadable result: %w", err)
	}
	return out, res, nil
}

// Runner is a cancellable or idempotent MCP tool.
type Runner struct{ *remoteTool }

// Run implements tools.Runner. A cancelled ctx sends
// notifications/cancelled and returns at once; a tool that reports an
// error (isError) fails the call with the server's words.
func (t *Runner) Run(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	out, res, err := t.call(ctx, key, args, nil)
	var wire *jsonrpc.Error
	switch {
	case err != nil && errors.As(err, &wire):
		return nil, fmt.Errorf("MCP %s: %w%s", t.spec.Name, err, taskHint(wire.Message))
	case err != nil:
		return nil, fmt.Errorf("MCP %s: %w", t.spec.Name, err)
	case res.IsError:
		text := resultText(res)
		return nil, fmt.Errorf("MCP %s reported an error: %s%s", t.spec.Name, text, taskHint(text))
	}
	return out, nil
}

// Committer is a consequential MCP tool: sent once per key, never again.
type Committer struct{ *remoteTool }

// Prepare implements tools.Committer: the preview names the server, the
// tool and the normalised arguments; the key is
// "<name>:<scope>:<16 hex of sha256(arguments)>:commit".
func (t *Committer) Prepare(scope string, args json.RawMessage) (json.RawMessage, string, error) {
	if scope == "" {
		return nil, "", fmt.Errorf("MCP %s: empty scope", t.spec.Name)
	}
	norm, err := t.Validate(args)
	if err != nil {
		return nil, "", err
	}
	preview, err := json.Marshal(struct {
		Server    string          `json:"server"`
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}{t.server.cfg.Name, t.remote, norm})
	if err != nil {
		return nil, "", err
	}
	return preview, tools.ActionKey(t.spec.Name, scope, norm), nil
}

// Commit implements tools.Committer. The key travels in the request's
// _meta as IdempotencyKeyMeta. A key this process already sent is not
// sent again (an error: the outcome stays unknown). Arguments that do not
// fit the schema, a server that is not connected, or the server refusing
// the request (unknown tool, invalid params) wrap tools.ErrRejected:
// nothing was done;
// anything else that is not a plain success — a tool that reports an
// error may have acted partway, a lost answer, a cancel — leaves the
// outcome unknown.
func (t *Committer) Commit(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	if _, err := t.Validate(args); err != nil {
		return nil, fmt.Errorf("%w: %w", tools.ErrRejected, err)
	}
	if !t.server.markSent(key) {
		return nil, fmt.Errorf("MCP %s: key %s was already sent once; an MCP server is not known to deduplicate, so it is not sent again", t.spec.Name, key)
	}
	out, res, err := t.call(ctx, key, args, mcp.Meta{IdempotencyKeyMeta: key})
	var wire *jsonrpc.Error
	switch {
	case err != nil && errors.As(err, &wire) && refusal(wire.Code):
		return nil, fmt.Errorf("%w: MCP %s refused the request: %v%s", tools.ErrRejected, t.spec.Name, err, taskHint(wire.Message))
	case isNotSent(err):
		t.server.unmarkSent(key)
		return nil, fmt.Errorf("%w: %w", tools.ErrRejected, err)
	case err != nil:
		return nil, fmt.Errorf("MCP %s: %w", t.spec.Name, err)
	case res.IsError:
		text := resultText(res)
		return nil, fmt.Errorf("MCP %s reported an error, and may have acted partway: %s%s", t.spec.Name, text, taskHint(text))
	}
	return out, nil
}

// Status implements tools.Committer: an MCP server cannot be asked about a
// key, so an outcome nobody saw stays unknown.
func (t *Committer) Status(context.Context, string) (tools.Status, error) {
	return tools.Status{}, fmt.Errorf("MCP %s: %w", t.spec.Name, tools.ErrNoLookup)
}

// refusal reports whether a JSON-RPC error code says the server refused
// the request before acting on it: an unknown method or tool, or
// arguments it does not take.
func refusal(code int64) bool {
	return code == jsonrpc.CodeMethodNotFound || code == jsonrpc.CodeInvalidParams
}

// taskHint explains a server's error that asks for task-augmented
// execution (a tool listed with execution.taskSupport "required"): the Go
// SDK this gateway uses has no MCP tasks, so such a tool cannot run here.
// The TypeScript SDK refuses such a call with isError and the words "requires
// task augmentation"; the error is still taken at its status (an isError
// answer stays unknown for a consequential call), only explained.
func taskHint(serverMessage string) string {
	if strings.Contains(serverMessage, "requires task augmentation") {
		return " (the tool must run as an MCP task, which this gateway does not support: see docs/tools.md, MCP servers)"
	}
	return ""
}

// isNotSent reports whether err says the request was never sent.
func isNotSent(err error) bool {
	var nc *NotConnectedError
	return errors.As(err, &nc)
}

// resultText is the text content of res, for messages (at most 500 bytes).
func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	s := b.String()
	if len(s) > 500 {
		s = strings.ToValidUTF8(s[:500], "") + "…" // not cut inside a character
	}
	if s == "" {
		s = "(no text)"
	}
	return s
}
