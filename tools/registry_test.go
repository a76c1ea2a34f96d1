package tools

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
)

// named is a tool that is only a name.
type named string

func (n named) Spec() Spec { return Spec{Name: string(n), Contract: Cancellable} }
func (n named) Validate(args json.RawMessage) (json.RawMessage, error) {
	return args, nil
}

// fromSource is a tool of a source, told apart from a named one.
type fromSource struct{ named }

// changing is a source whose tools the test replaces, as an MCP server's
// change when it first lists them.
type changing struct {
	mu    sync.Mutex
	tools []Tool
}

func (c *changing) Tools() []Tool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tools
}

func (c *changing) set(ts ...Tool) {
	c.mu.Lock()
	c.tools = ts
	c.mu.Unlock()
}

func specNames(r *Registry) []string {
	var out []string
	for _, s := range r.Specs() {
		out = append(out, s.Name)
	}
	return out
}

// A source's tools appear once it has them, after the registry's own; a
// name taken before is not offered again, and Get agrees with Specs.
func TestRegistrySources(t *testing.T) {
	a, b := &changing{}, &changing{}
	r, err := NewRegistry(named("catalog_search"), named("send_email"))
	if err != nil {
		t.Fatal(err)
	}
	r = r.WithSources(a, b)
	if got := specNames(r); !slices.Equal(got, []string{"catalog_search", "send_email"}) {
		t.Fatalf("before the sources listed anything: %v", got)
	}
	if _, ok := r.Get("a__echo"); ok {
		t.Error("Get found a tool no source has yet")
	}
	a.set(fromSource{"a__echo"}, fromSource{"send_email"})
	b.set(named("a__echo"), named("b__pay"))
	if got := specNames(r); !slices.Equal(got, []string{"catalog_search", "send_email", "a__echo", "b__pay"}) {
		t.Fatalf("with the sources' tools: %v", got)
	}
	for _, name := range []string{"a__echo", "b__pay", "send_email"} {
		if tl, ok := r.Get(name); !ok || tl.Spec().Name != name {
			t.Errorf("Get(%s) = %v, %v", name, tl, ok)
		}
	}
	if tl, _ := r.Get("send_email"); tl != Tool(named("send_email")) {
		t.Error("a source's tool shadows the registry's own")
	}
}
