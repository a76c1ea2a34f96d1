package tools

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

// Catalog returns the built-in catalog, ordered by SKU.
func Catalog() []Product {
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

// DefaultCatalogLimit is the number of matches when "limit" is absent.
const DefaultCatalogLimit = 5

// CatalogSearch is the catalog_search tool (contract idempotent): it finds
// products of the built-in catalog. The same arguments always give the same
// result.
type CatalogSearch struct {
	*SchemaTool
	latency time.Duration
}

var _ Runner = (*CatalogSearch)(nil)

// NewCatalogSearch returns the tool; every Run takes latency (0 for none)
// before answering, so cancelling a search in flight can be tried.
func NewCatalogSearch(latency time.Duration) *CatalogSearch {
	return &CatalogSearch{
		SchemaTool: MustSchemaTool(Spec{
			Name:        "catalog_search",
			Description: "Search the product catalog. Returns matching products with SKU, name and price in EUR.",
			Contract:    Idempotent,
		}, catalogSchema),
		latency: latency,
	}
}

// CatalogMatch is one product in a catalog_search result.
type CatalogMatch struct {
	SKU      string      `json:"sku"`
	Name     string      `json:"name"`
	Price    json.Number `json:"price"` // two decimals, e.g. 129.90
	Currency string      `json:"currency"`
}

// CatalogResult is the result of catalog_search.
type CatalogResult struct {
	Matches []CatalogMatch `json:"matches"`
	Query   string         `json:"query"`
}

// Run implements Runner. It waits the configured latency (returning
// ctx.Err() at once if ctx ends first) and then answers; key is unused
// because the answer depends on args alone.
func (c *CatalogSearch) Run(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	norm, err := c.Validate(args)
	if err != nil {
		return nil, err
	}
	var a struct {
		Query string `json:"query"`
		Limit *int   `json:"limit"`
	}
	if err := json.Unmarshal(norm, &a); err != nil {
		return nil, &InvalidArgs{Reason: err.Error()}
	}
	limit := DefaultCatalogLimit
	if a.Limit != nil {
		limit = *a.Limit
	}
	if err := Wait(ctx, c.latency); err != nil {
		return nil, err
	}
	res, err := SearchCatalog(a.Query, limit)
	if err != nil {
		return nil, err
	}
	return Compact(res)
}

// SearchCatalog ranks the catalog against query: each distinct query word
// scores 3 if it is a word of the name, else 2 if of a tag, else 1 if of
// the description. Products scoring 0 are left out; higher scores come
// first, equal scores by SKU. At most limit matches are returned.
func SearchCatalog(query string, limit int) (CatalogResult, error) {
	ips, err := catalogOnce()
	if err != nil {
		return CatalogResult{}, err
	}
	res := CatalogResult{Matches: []CatalogMatch{}, Query: query}
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
		res.Matches = append(res.Matches, CatalogMatch{
			SKU:      h.ip.SKU,
			Name:     h.ip.Name,
			Price:    json.Number(strconv.FormatFloat(h.ip.Price, 'f', 2, 64)),
			Currency: h.ip.Currency,
		})
	}
	return res, nil
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
