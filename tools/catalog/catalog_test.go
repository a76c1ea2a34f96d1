package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/honestcancel/gateway/tools"
)

func TestCatalogLoads(t *testing.T) {
	ps := Products()
	if len(ps) < 30 {
		t.Fatalf("catalog has %d products", len(ps))
	}
	for i, p := range ps {
		if p.Name == "" || p.Description == "" || p.Price <= 0 || p.Currency != "EUR" || len(p.Tags) == 0 {
			t.Errorf("incomplete product %+v", p)
		}
		if i > 0 && ps[i-1].SKU >= p.SKU {
			t.Errorf("not ordered by sku: %s then %s", ps[i-1].SKU, p.SKU)
		}
	}
}

func runCatalog(t *testing.T, c *Tool, args string) Result {
	t.Helper()
	out, err := c.Run(context.Background(), "op_1", json.RawMessage(args))
	if err != nil {
		t.Fatalf("Run(%s): %v", args, err)
	}
	var res Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("result %s: %v", out, err)
	}
	return res
}

func skus(r Result) []string {
	var out []string
	for _, m := range r.Matches {
		out = append(out, m.SKU)
	}
	return out
}

func TestCatalogRanking(t *testing.T) {
	c := New(0)
	// TECH-001: "headphones" in the name (3) + "wireless" a tag (2) = 5;
	// TECH-002 and TECH-005: "wireless" in the name (3), tie broken by sku;
	// TECH-003: "wireless" a tag (2).
	res := runCatalog(t, c, `{"query":"Wireless HEADPHONES!","limit":4}`)
	want := []string{"TECH-001", "TECH-002", "TECH-005", "TECH-003"}
	if got := skus(res); !slices.Equal(got, want) {
		t.Fatalf("matches = %v, want %v", got, want)
	}
	if res.Query != "Wireless HEADPHONES!" {
		t.Errorf("query = %q", res.Query)
	}
	m := res.Matches[0]
	if m.Name != "Noise-cancelling headphones" || m.Price != "279.00" || m.Currency != "EUR" {
		t.Errorf("first match = %+v", m)
	}

	// Same args, written differently, give the same bytes.
	a, err := c.Run(context.Background(), "k1", json.RawMessage(`{"query":"coffee","limit":3}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Run(context.Background(), "k2", json.RawMessage(` {"limit":3.0, "query":"coffee"}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Fatalf("different results:\n%s\n%s", a, b)
	}
	// HOME-002 has "coffee" in its name (3), HOME-001 as a tag (2).
	if got := skus(runCatalog(t, c, `{"query":"coffee"}`)); !slices.Equal(got, []string{"HOME-002", "HOME-001"}) {
		t.Errorf("coffee: %v", got)
	}
}

func TestCatalogLimit(t *testing.T) {
	c := New(0)
	if got := len(runCatalog(t, c, `{"query":"outdoor"}`).Matches); got != DefaultLimit {
		t.Errorf("default limit: %d matches", got)
	}
	if got := len(runCatalog(t, c, `{"query":"outdoor","limit":2}`).Matches); got != 2 {
		t.Errorf("limit 2: %d matches", got)
	}
	all := runCatalog(t, c, `{"query":"outdoor","limit":20}`)
	if len(all.Matches) <= DefaultLimit {
		t.Fatalf("only %d outdoor products", len(all.Matches))
	}
	// A smaller limit is a prefix of a larger one.
	two := runCatalog(t, c, `{"query":"outdoor","limit":2}`)
	if !slices.Equal(skus(two), skus(all)[:2]) {
		t.Errorf("limit 2 = %v, not a prefix of %v", skus(two), skus(all))
	}
	for _, bad := range []string{`{"query":"x","limit":0}`, `{"query":"x","limit":21}`, `{"query":""}`, `{"limit":3}`, `{"query":"x","sort":"price"}`} {
		_, err := c.Run(context.Background(), "k", json.RawMessage(bad))
		var ia *tools.InvalidArgs
		if !errors.As(err, &ia) {
			t.Errorf("Run(%s): err = %v, want *InvalidArgs", bad, err)
		}
	}
}

func TestCatalogEmpty(t *testing.T) {
	c := New(0)
	for _, q := range []string{"submarine periscope", "!!!", " "} {
		out, err := c.Run(context.Background(), "k", json.RawMessage(`{"query":"`+q+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		want := `{"matches":[],"query":"` + q + `"}`
		if string(out) != want {
			t.Errorf("query %q: %s, want %s", q, out, want)
		}
	}
}

func TestCatalogCancel(t *testing.T) {
	c := New(10 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Run(ctx, "k", json.RawMessage(`{"query":"coffee"}`))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancel took %v", d)
	}
}

func TestCatalogLatency(t *testing.T) {
	c := New(80 * time.Millisecond)
	start := time.Now()
	runCatalog(t, c, `{"query":"coffee"}`)
	if d := time.Since(start); d < 80*time.Millisecond {
		t.Fatalf("answered after %v, latency is 80ms", d)
	}
}
