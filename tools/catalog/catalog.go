// Package catalog owns the built-in demo tool catalog_search (contract
// idempotent) and the product catalog it searches, which ships in the
// binary as catalog.json. Search ranks the catalog against a query; Tool
// (New) is the tool, with a configurable latency standing for an external
// system's so that cancelling a search in flight can be tried.
package catalog

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/schema"
)

//go:embed catalog.json
var catalogJSON []byte

// Product is one entry of the built-in demo catalog.
type Product struct {
	SKU         string   `json:"sku"`
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Price       float64  `json:"price"`
	Currency    string   `json:"currency"`
	Tags        []string `json:"tags"`
}

type indexedProduct struct {
	Product
	name, desc, tags map[string]bool // lower-case tokens
}

var catalogOnce = sync.OnceValues(loadCatalog)

func loadCatalog() ([]indexedProduct, error) {
	var ps []Product
	if err := json.Unmarshal(catalogJSON, &ps); err != nil {
		return nil, fmt.Errorf("catalog.json: %w", err)
	}
	seen := map[string]bool{}
	out := make([]indexedProduct, 0, len(ps))
	for _, p := range ps {
		if p.SKU == "" || seen[p.SKU] {
			return nil, fmt.Errorf("catalog.json: empty or duplicate sku %q", p.SKU)
		}
		seen[p.SKU] = true
		ip := indexedProduct{Product: p, name: tokenSet(p.Name), desc: tokenSet(p.Description), tags: map[string]bool{}}
		for _, t := range p.Tags {
			for k := range tokenSet(t) {
				ip.tags[k] = true
			}
		}
		out = append(out, ip)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out, nil
}

// Products returns the built-in catalog, ordered by SKU.
func Products() []Product {
	ips, err := catalogOnce()
	if err != nil {
		panic(err) // the file ships with the binary; tests load it
	}
	out := make([]Product, len(ips))
	for i, ip := range ips {
		out[i] = ip.Product
		out[i].Tags = append([]string(nil), ip.Tags...)
	}
	return out
}

// tokens splits s into lower-case runs of letters and digits.
func tokens(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
}

func tokenSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, t := range tokens(s) {
		m[t] = true
	}
	return m
}

const catalogSchema = `{
  "type": "object",
  "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 200, "description": "Words to look for in product names, descriptions and tags."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Most matches to return (default 5)."}
  },
  "required": ["query"],
  "additionalProperties": false
}`

// DefaultLimit is the number of matches when "limit" is absent.
const DefaultLimit = 5

// Tool is the catalog_search tool (contract idempotent): it finds
// products of the built-in catalog. The same arguments always give the same
// result.
type Tool struct {
	*schema.Tool
	latency time.Duration
}

var _ tools.Runner = (*Tool)(nil)

// New returns the tool; every Run takes latency (0 for none)
// before answering, so cancelling a search in flight can be tried.
func New(latency time.Duration) *Tool {
	return &Tool{
		Tool: schema.MustTool(tools.Spec{
			Name:        "catalog_search",
			Description: "Search the product catalog. Returns matching products with SKU, name and price in EUR.",
			Contract:    tools.Idempotent,
		}, catalogSchema),
		latency: latency,
	}
}

// Match is one product in a catalog_search result.
type Match struct {
	SKU      string      `json:"sku"`
	Name     string      `json:"name"`
	Price    json.Number `json:"price"` // two decimals, e.g. 129.90
	Currency string      `json:"currency"`
}

// Result is the result of catalog_search.
type Result struct {
	Matches []Match `json:"matches"`
	Query   string  `json:"query"`
}

// Run implements tools.Runner. It waits the configured latency (returning
// ctx.Err() at once if ctx ends first) and then answers; key is unused
// because the answer depends on args alone.
func (c *Tool) Run(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	norm, err := c.Validate(args)
	if err != nil {
		return nil, err
	}
	var a struct {
		Query string `json:"query"`
		Limit *int   `json:"limit"`
	}
	if err := json.Unmarshal(norm, &a); err != nil {
		return nil, &tools.InvalidArgs{Reason: err.Error()}
	}
	limit := DefaultLimit
	if a.Limit != nil {
		limit = *a.Limit
	}
	if err := tools.Wait(ctx, c.latency); err != nil {
		return nil, err
	}
	res, err := Search(a.Query, limit)
	if err != nil {
		return nil, err
	}
	return schema.Compact(res)
}

// Search ranks the catalog against query: each distinct query word
// scores 3 if it is a word of the name, else 2 if of a tag, else 1 if of
// the description. Products scoring 0 are left out; higher scores come
// first, equal scores by SKU. At most limit matches are returned.
func Search(query string, limit int) (Result, error) {
	ips, err := catalogOnce()
	if err != nil {
		return Result{}, err
	}
	res := Result{Matches: []Match{}, Query: query}
	qs := tokenSet(query)
	if len(qs) == 0 || limit <= 0 {
		return res, nil
	}
	type scored struct {
		ip    *indexedProduct
		score int
	}
	var hits []scored
	for i := range ips {
		ip := &ips[i]
		score := 0
		for q := range qs {
			switch {
			case ip.name[q]:
				score += 3
			case ip.tags[q]:
				score += 2
			case ip.desc[q]:
				score++
			}
		}
		if score > 0 {
			hits = append(hits, scored{ip, score})
		}
	}
	sort.Slice(hits, func(i, j int) bool {
		if hits[i].score != hits[j].score {
			return hits[i].score > hits[j].score
		}
		return hits[i].ip.SKU < hits[j].ip.SKU
	})
	if len(hits) > limit {
		hits = hits[:limit]
	}
	for _, h := range hits {
		res.Matches = append(res.Matches, Match{
			SKU:      h.ip.SKU,
			Name:     h.ip.Name,
			Price:    json.Number(strconv.FormatFloat(h.ip.Price, 'f', 2, 64)),
			Currency: h.ip.Currency,
		})
	}
	return res, nil
}
