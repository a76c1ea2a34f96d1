// Package tools defines what a tool an agent may call is: each has a
// contract that says what a cancel can honestly do to it:
//
//   - cancellable: can be aborted; after a cancel its result is absent and
//     the step runs again on resume.
//   - idempotent: safe to repeat; on cancel the engine waits for (or fetches
//     by key) its result and records it, so the next run reuses it.
//   - consequential: changes something outside the gateway (send, pay,
//     book). Two phases: Prepare builds what the user sees and a business
//     idempotency key; only after the user confirms does Commit hand the
//     call, with the key, to the external system; Status looks the key up
//     there to reconcile an outcome nobody saw.
//
// The registry is read-only after construction and safe for concurrent
// use; the tools of its sources (MCP servers) may change while it serves.
//
// This package owns only that contract (Spec, Tool, Runner, Committer,
// InvalidArgs, …), the Registry, the helpers every tool shares (Wait,
// progress reports, ActionKey, the tools config's env references) and
// imports no tool. The tools themselves and their parts live below it:
// tools/schema (JSON Schema of arguments, and schema.Tool to embed),
// tools/catalog (catalog_search), tools/email (send_email), tools/webhook
// (the operator's HTTP tools) and tools/mcp (MCP servers' tools).
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Contracts.
const (
	Cancellable   = "cancellable"
	Idempotent    = "idempotent"
	Consequential = "consequential"
)

// Spec describes a tool to the model and to clients.
type Spec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Contract    string          `json:"contract"`
	Parameters  json.RawMessage `json:"parameters"` // JSON Schema of the arguments
}

// Tool is any tool. Validate checks arguments against the schema and
// returns them normalised (the bytes that will be stored and hashed).
type Tool interface {
	Spec() Spec
	Validate(args json.RawMessage) (json.RawMessage, error)
}

// Runner is a cancellable or idempotent tool. key identifies the call (the
// operation's idempotency key), so an idempotent tool can be asked again
// for the same result.
type Runner interface {
	Tool
	Run(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error)
}

// Committer is a consequential tool.
type Committer interface {
	Tool
	// Prepare returns what the user must see before confirming (the draft)
	// and the business idempotency key of the action, e.g.
	// "email:<scope>:<draft-hash>:send". scope names the step of the
	// conversation that asks for the action — the same when that step is
	// resumed after a cancel or continued in a fork — so the key names the
	// action, not the attempt.
	Prepare(scope string, args json.RawMessage) (preview json.RawMessage, key string, err error)
	// Commit performs the action once per key: a second Commit with the same
	// key returns the first outcome and acts no more.
	Commit(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error)
	// Status reports what the external system knows of key.
	Status(ctx context.Context, key string) (Status, error)
}

// Resender is a Committer whose external system acts at most once per key
// however often the key is sent (it deduplicates, as a service honouring
// Idempotency-Key does). Only such a call is sent again under its key when
// its answer was lost; any other Committer is sent at most once per key,
// and an answer lost stays unknown until Status finds the key (invariant
// 2: one key, at most one action).
type Resender interface {
	Committer
	// ResendSafe reports whether the system deduplicates by key.
	ResendSafe() bool
}

// ResendSafe reports whether c may be sent a key again (see Resender).
func ResendSafe(c Committer) bool {
	r, ok := c.(Resender)
	return ok && r.ResendSafe()
}

// Status of a key at the external system.
type Status struct {
	Known  bool            // the system accepted the key
	Result json.RawMessage // its result, when Known
}

// ErrNoLookup is returned (wrapped) by Status when the external system
// cannot be asked about a key at all, as an MCP server cannot: an outcome
// nobody saw then stays unknown, and the gateway says it is not asking
// instead of scheduling lookups that cannot answer.
var ErrNoLookup = errors.New("the external system cannot be asked whether a key acted")

// ErrRejected is returned by Commit when the external system refused the
// action for good (it did nothing). Other errors leave the outcome unknown
// until Status says.
var ErrRejected = errors.New("the external system rejected the action")

// InvalidArgs is returned by Validate; its message says what to fix.
type InvalidArgs struct{ Reason string }

func (e *InvalidArgs) Error() string { return "invalid tool arguments: " + e.Reason }

// Registry is the set of tools, by name: tools given at construction,
// then those of its sources.
type Registry struct {
	byName  map[string]Tool
	order   []string
	sources []Source
}

// Source offers tools that may change over time (an MCP server's, once it
// listed them). Tools must be safe for concurrent use.
type Source interface {
	Tools() []Tool
}

// NewRegistry returns a registry of the given tools; names must be unique.
func NewRegistry(ts ...Tool) (*Registry, error) {
	r := &Registry{byName: map[string]Tool{}}
	for _, t := range ts {
		name := t.Spec().Name
		if _, dup := r.byName[name]; dup {
			return nil, errors.New("two tools are named " + name)
		}
		r.byName[name] = t
		r.order = append(r.order, name)
	}
	return r, nil
}

// WithSources returns r with sources added, asked on every Get and Specs
// in the order given. A source's tool named like a tool before it is not
// offered. Call it before r is used.
func (r *Registry) WithSources(sources ...Source) *Registry {
	r.sources = append(r.sources, sources...)
	return r
}

// Get returns the tool named name.
func (r *Registry) Get(name string) (Tool, bool) {
	if t, ok := r.byName[name]; ok {
		return t, true
	}
	for _, s := range r.sources {
		for _, t := range s.Tools() {
			if t.Spec().Name == name {
				return t, true
			}
		}
	}
	return nil, false
}

// Specs lists every tool: those given at construction in their order, then
// each source's.
func (r *Registry) Specs() []Spec {
	out := make([]Spec, 0, len(r.order))
	seen := make(map[string]bool, len(r.order))
	for _, n := range r.order {
		out = append(out, r.byName[n].Spec())
		seen[n] = true
	}
	for _, s := range r.sources {
		for _, t := range s.Tools() {
			if spec := t.Spec(); !seen[spec.Name] {
				out = append(out, spec)
				seen[spec.Name] = true
			}
		}
	}
	return out
}

// Wait sleeps d or until ctx ends, whichever is first: the latency of a
// simulated external system (the catalog, the email provider).
func Wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
