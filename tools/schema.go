package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/mail"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxArgsBytes is the largest argument document Validate accepts.
const MaxArgsBytes = 64 << 10

// Schema is a compiled subset of JSON Schema, enough for tool arguments:
//
//   - "type": one of string, number, integer, boolean, array, object
//     (required on every schema, and the root must be an object);
//   - objects: "properties", "required", "additionalProperties" (a boolean;
//     false rejects unknown fields);
//   - strings: "minLength", "maxLength" (in Unicode code points), "format":
//     "email" (one bare address such as ann@example.com);
//   - numbers and integers: "minimum", "maximum";
//   - strings, numbers, integers and booleans: "enum";
//   - arrays: "items", "minItems", "maxItems".
//
// Annotations (title, description, default, examples, $schema, $id,
// $comment) are accepted and ignored; any other keyword is an error at
// compile time, so a schema never validates less than its author thinks.
// A Schema is immutable and safe for concurrent use.
type Schema struct {
	raw  json.RawMessage // compact form of the source
	root *node
}

type node struct {
	typ string

	// object
	props      map[string]*node
	required   []string
	closed     bool // additionalProperties: false
	propsOrder []string

	// string
	minLen, maxLen *int
	email          bool

	// number / integer
	min, max *float64

	// array
	items              *node
	minItems, maxItems *int

	enum []any // decoded with UseNumber; compared after normalisation
}

var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true,
}

// CompileSchema parses a JSON Schema of tool arguments. The root must be
// {"type":"object", ...}.
func CompileSchema(src json.RawMessage) (*Schema, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, src); err != nil {
		return nil, fmt.Errorf("schema: not valid JSON: %w", err)
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("schema: not valid JSON: %w", err)
	}
	root, err := compileNode(doc, "")
	if err != nil {
		return nil, err
	}
	if root.typ != "object" {
		return nil, errors.New(`schema: the root must have "type": "object"`)
	}
	return &Schema{raw: json.RawMessage(buf.Bytes()), root: root}, nil
}

// MustCompileSchema is CompileSchema for schemas written in the source; it
// panics on error.
func MustCompileSchema(src string) *Schema {
	s, err := CompileSchema(json.RawMessage(src))
	if err != nil {
		panic(err)
	}
	return s
}

// JSON returns the schema as compact JSON (for Spec.Parameters).
func (s *Schema) JSON() json.RawMessage { return append(json.RawMessage(nil), s.raw...) }

func compileNode(v any, path string) (*node, error) {
	where := "schema"
	if path != "" {
		where = "schema of " + strconv.Quote(path)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a JSON object", where)
	}
	n := &node{}
	t, ok := m["type"].(string)
	if !ok {
		return nil, fmt.Errorf(`%s: "type" must be one of string, number, integer, boolean, array, object`, where)
	}
	switch t {
	case "string", "number", "integer", "boolean", "array", "object":
		n.typ = t
	default:
		return nil, fmt.Errorf("%s: unsupported type %q", where, t)
	}
	allowed := map[string]bool{"type": true}
	switch t {
	case "string", "number", "integer", "boolean":
		allowed["enum"] = true // scalars only: values compare with ==
	}
	switch t {
	case "object":
		allowed["properties"], allowed["required"], allowed["additionalProperties"] = true, true, true
	case "string":
		allowed["minLength"], allowed["maxLength"], allowed["format"] = true, true, true
	case "number", "integer":
		allowed["minimum"], allowed["maximum"] = true, true
	case "array":
		allowed["items"], allowed["minItems"], allowed["maxItems"] = true, true, true
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !allowed[k] && !annotations[k] {
			return nil, fmt.Errorf("%s: keyword %q is not supported for type %s", where, k, t)
		}
	}

	count := func(k string) (*int, error) {
		raw, ok := m[k]
		if !ok {
			return nil, nil
		}
		num, ok := raw.(json.Number)
		if !ok {
			return nil, fmt.Errorf("%s: %q must be a non-negative integer", where, k)
		}
		i, err := strconv.Atoi(num.String())
		if err != nil || i < 0 {
			return nil, fmt.Errorf("%s: %q must be a non-negative integer", where, k)
		}
		return &i, nil
	}
	bound := func(k string) (*float64, error) {
		raw, ok := m[k]
		if !ok {
			return nil, nil
		}
		num, ok := raw.(json.Number)
		if !ok {
			return nil, fmt.Errorf("%s: %q must be a number", where, k)
		}
		f, err := num.Float64()
		if err != nil {
			return nil, fmt.Errorf("%s: %q must be a number", where, k)
		}
		return &f, nil
	}
	var err error

	switch t {
	case "object":
		if raw, ok := m["properties"]; ok {
			pm, ok := raw.(map[string]any)
			if !ok {
				return nil, fmt.Errorf(`%s: "properties" must be an object`, where)
			}
			n.props = map[string]*node{}
			for name, sub := range pm {
				c, err := compileNode(sub, joinPath(path, name))
				if err != nil {
					return nil, err
				}
				n.props[name] = c
				n.propsOrder = append(n.propsOrder, name)
			}
			sort.Strings(n.propsOrder)
		}
		if raw, ok := m["required"]; ok {
			list, ok := raw.([]any)
			if !ok {
				return nil, fmt.Errorf(`%s: "required" must be an array of names`, where)
			}
			for _, r := range list {
				name, ok := r.(string)
				if !ok {
					return nil, fmt.Errorf(`%s: "required" must be an array of names`, where)
				}
				if _, known := n.props[name]; !known {
					return nil, fmt.Errorf(`%s: required field %q has no entry in "properties"`, where, name)
				}
				n.required = append(n.required, name)
			}
		}
		if raw, ok := m["additionalProperties"]; ok {
			b, ok := raw.(bool)
			if !ok {
				return nil, fmt.Errorf(`%s: "additionalProperties" must be true or false`, where)
			}
			n.closed = !b
		}
	case "string":
		if n.minLen, err = count("minLength"); err != nil {
			return nil, err
		}
		if n.maxLen, err = count("maxLength"); err != nil {
			return nil, err
		}
		if raw, ok := m["format"]; ok {
			if raw != "email" {
				return nil, fmt.Errorf(`%s: only "format": "email" is supported`, where)
			}
			n.email = true
		}
	case "number", "integer":
		if n.min, err = bound("minimum"); err != nil {
			return nil, err
		}
		if n.max, err = bound("maximum"); err != nil {
			return nil, err
		}
	case "array":
		if raw, ok := m["items"]; ok {
			if n.items, err = compileNode(raw, path+"[]"); err != nil {
				return nil, err
			}
		}
		if n.minItems, err = count("minItems"); err != nil {
			return nil, err
		}
		if n.maxItems, err = count("maxItems"); err != nil {
			return nil, err
		}
	}
	if raw, ok := m["enum"]; ok {
		list, ok := raw.([]any)
		if !ok || len(list) == 0 {
			return nil, fmt.Errorf(`%s: "enum" must be a non-empty array`, where)
		}
		for _, e := range list {
			// An enum value must itself be valid for the node, so that a
			// mismatch is reported as "must be one of".
			ne := *n
			ne.enum = nil
			norm, reason := ne.check(e, path)
			if reason != "" {
				return nil, fmt.Errorf(`%s: "enum" value %v does not match the type: %s`, where, e, reason)
			}
			n.enum = append(n.enum, norm)
		}
	}
	return n, nil
}

func joinPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// Validate checks args against the schema and returns them re-encoded:
// compact, object keys sorted, integers and numbers in canonical form,
// HTML characters not escaped. The same arguments written differently
// (spacing, key order, 5 vs 5.0 for an integer) give the same bytes. A
// failure is an *InvalidArgs whose reason a user can act on.
func (s *Schema) Validate(args json.RawMessage) (json.RawMessage, error) {
	if len(args) > MaxArgsBytes {
		return nil, &InvalidArgs{Reason: fmt.Sprintf("arguments are larger than %d KiB", MaxArgsBytes>>10)}
	}
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || !json.Valid(trimmed) {
		return nil, &InvalidArgs{Reason: "arguments are not valid JSON"}
	}
	if trimmed[0] != '{' {
		return nil, &InvalidArgs{Reason: "arguments must be a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, &InvalidArgs{Reason: "arguments are not valid JSON"}
	}
	norm, reason := s.root.check(doc, "")
	if reason != "" {
		return nil, &InvalidArgs{Reason: reason}
	}
	out, err := Compact(norm)
	if err != nil {
		return nil, &InvalidArgs{Reason: "arguments cannot be encoded: " + err.Error()}
	}
	return out, nil
}

// Compact is json.Marshal without HTML escaping (so "<" stays "<" in
// stored arguments and previews); map keys come out sorted.
func Compact(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n")), nil
}

func subject(path string) string {
	if path == "" {
		return "arguments"
	}
	return "field " + strconv.Quote(path)
}

func article(typ string) string {
	switch typ {
	case "integer", "array", "object":
		return "an " + typ
	case "boolean":
		return "true or false"
	}
	return "a " + typ
}

// check validates v and returns it normalised, or a reason.
func (n *node) check(v any, path string) (any, string) {
	var out any
	switch n.typ {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return nil, subject(path) + " must be an object"
		}
		for _, name := range n.required {
			if _, ok := m[name]; !ok {
				return nil, subject(joinPath(path, name)) + " is required"
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		res := make(map[string]any, len(m))
		for _, k := range keys {
			sub, known := n.props[k]
			if !known {
				if n.closed {
					return nil, "unknown " + subject(joinPath(path, k))
				}
				res[k] = m[k]
				continue
			}
			nv, reason := sub.check(m[k], joinPath(path, k))
			if reason != "" {
				return nil, reason
			}
			res[k] = nv
		}
		out = res
	case "array":
		list, ok := v.([]any)
		if !ok {
			return nil, subject(path) + " must be an array"
		}
		if n.minItems != nil && len(list) < *n.minItems {
			return nil, fmt.Sprintf("%s must have at least %d %s", subject(path), *n.minItems, plural(*n.minItems, "item"))
		}
		if n.maxItems != nil && len(list) > *n.maxItems {
			return nil, fmt.Sprintf("%s must have at most %d %s", subject(path), *n.maxItems, plural(*n.maxItems, "item"))
		}
		res := make([]any, len(list))
		for i, e := range list {
			if n.items == nil {
				res[i] = e
				continue
			}
			nv, reason := n.items.check(e, fmt.Sprintf("%s[%d]", path, i))
			if reason != "" {
				return nil, reason
			}
			res[i] = nv
		}
		out = res
	case "string":
		s, ok := v.(string)
		if !ok {
			return nil, subject(path) + " must be a string"
		}
		l := utf8.RuneCountInString(s)
		if n.minLen != nil && l < *n.minLen {
			if *n.minLen == 1 {
				return nil, subject(path) + " must not be empty"
			}
			return nil, fmt.Sprintf("%s must be at least %d characters long", subject(path), *n.minLen)
		}
		if n.maxLen != nil && l > *n.maxLen {
			return nil, fmt.Sprintf("%s must be at most %d characters long", subject(path), *n.maxLen)
		}
		if n.email && !isEmail(s) {
			return nil, subject(path) + " must be an email address"
		}
		out = s
	case "boolean":
		b, ok := v.(bool)
		if !ok {
			return nil, subject(path) + " must be true or false"
		}
		out = b
	case "number", "integer":
		num, ok := v.(json.Number)
		if !ok {
			return nil, subject(path) + " must be " + article(n.typ)
		}
		f, err := strconv.ParseFloat(num.String(), 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, subject(path) + " is out of range"
		}
		if n.typ == "integer" {
			i, err := strconv.ParseInt(num.String(), 10, 64)
			if err != nil {
				// 5.0 and 5e2 are integers too; anything else is not.
				if f != math.Trunc(f) {
					return nil, subject(path) + " must be an integer"
				}
				if f < -(1<<63) || f >= 1<<63 {
					return nil, subject(path) + " is out of range"
				}
				i = int64(f)
			}
			out = json.Number(strconv.FormatInt(i, 10))
		} else {
			out = json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
		if n.min != nil && f < *n.min {
			return nil, fmt.Sprintf("%s must be at least %s", subject(path), formatBound(*n.min))
		}
		if n.max != nil && f > *n.max {
			return nil, fmt.Sprintf("%s must be at most %s", subject(path), formatBound(*n.max))
		}
	}
	if n.enum != nil {
		for _, e := range n.enum {
			if e == out {
				return out, ""
			}
		}
		opts := make([]string, len(n.enum))
		for i, e := range n.enum {
			b, _ := Compact(e)
			opts[i] = string(b)
		}
		return nil, subject(path) + " must be one of " + strings.Join(opts, ", ")
	}
	return out, ""
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func formatBound(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// isEmail accepts one bare address (no display name, no angle brackets, no
// surrounding space) whose domain has a dot, such as ann@example.com.
func isEmail(s string) bool {
	if len(s) > 254 || strings.ContainsAny(s, " \t\r\n<>") {
		return false
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s {
		return false
	}
	at := strings.LastIndexByte(s, '@')
	if at <= 0 {
		return false
	}
	domain := s[at+1:]
	if !strings.Contains(domain, ".") || strings.HasPrefix(domain, ".") ||
		strings.HasSuffix(domain, ".") || strings.Contains(domain, "..") {
		return false
	}
	return true
}

// SchemaTool is a Tool whose Validate is its schema. Embed it in a tool
// (a built-in or a webhook tool) to get Spec and Validate.
type SchemaTool struct {
	spec   Spec
	schema *Schema
}

// NewSchemaTool compiles schema and returns a Tool with spec, whose
// Parameters become the compiled schema's JSON. It checks that the spec
// has a name and a known contract.
func NewSchemaTool(spec Spec, schema json.RawMessage) (*SchemaTool, error) {
	if spec.Name == "" {
		return nil, errors.New("tool: empty name")
	}
	switch spec.Contract {
	case Cancellable, Idempotent, Consequential:
	default:
		return nil, fmt.Errorf("tool %s: unknown contract %q", spec.Name, spec.Contract)
	}
	s, err := CompileSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("tool %s: %w", spec.Name, err)
	}
	spec.Parameters = s.JSON()
	return &SchemaTool{spec: spec, schema: s}, nil
}

// MustSchemaTool is NewSchemaTool for a schema written in the tool's own
// source: a mistake there is a bug, so it panics.
func MustSchemaTool(spec Spec, schema string) *SchemaTool {
	t, err := NewSchemaTool(spec, json.RawMessage(schema))
	if err != nil {
		panic(err)
	}
	return t
}

// Spec implements Tool.
func (t *SchemaTool) Spec() Spec {
	s := t.spec
	s.Parameters = t.schema.JSON()
	return s
}

// Validate implements Tool.
func (t *SchemaTool) Validate(args json.RawMessage) (json.RawMessage, error) {
	return t.schema.Validate(args)
}

// Schema returns the compiled schema.
func (t *SchemaTool) Schema() *Schema { return t.schema }
