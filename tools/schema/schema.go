// Package schema owns the JSON Schema layer of tools: it compiles the
// schema of a tool's arguments (Compile for the gateway's own tools and
// webhook tools, with checks against schemas that validate less than their
// author thinks; CompileExternal for third-party schemas such as an MCP
// server's), validates and normalises arguments against it, and phrases
// what is wrong with them for a user or the model. Tool (NewTool, MustTool)
// is the tools.Tool whose Validate is its schema, for other tools to embed.
//
// It depends on package tools (Spec, the contracts, InvalidArgs); tools
// does not depend on it.
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/mail"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/honestcancel/gateway/tools"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// MaxArgsBytes is the largest argument document Validate accepts.
const MaxArgsBytes = 64 << 10

// Schema is a compiled JSON Schema of a tool's arguments, validated by
// github.com/santhosh-tekuri/jsonschema/v6.
//
// Drafts: a schema without "$schema" is draft 2020-12; a "$schema" naming
// draft 2019-09, draft-07, draft-06 or draft-04 selects that draft. Any other
// "$schema" (a custom metaschema) is refused, since it would have to be loaded.
//
// References: "$ref" (and "$dynamicRef") may only point inside the schema
// document, e.g. "#/$defs/address" or an "$anchor"; nothing is ever loaded
// from the network or from files, so a reference to another document is an
// error at compile time, as is a reference that loops back to where it
// started without going into the value.
//
// Formats are asserted, not mere annotations: "email" accepts one bare
// address whose domain has a dot (ann@example.com, not "Ann
// <ann@example.com>" nor ann@localhost); date, time, date-time, duration,
// period, uri, uri-reference, uri-template, iri, iri-reference, hostname,
// ipv4, ipv6, uuid, json-pointer, relative-json-pointer, semver and regex are
// checked by the library. "pattern" and "patternProperties" use Go's RE2
// syntax (no look-around or back-references). Content keywords
// (contentEncoding, contentMediaType, contentSchema) are annotations.
//
// A Schema is immutable and safe for concurrent use.
type Schema struct {
	raw json.RawMessage // compact form of the source
	sch *jsonschema.Schema
}

// schemaURL names the schema document inside the compiler. Its scheme is
// one no loader serves, and it is hierarchical so that a relative "$ref"
// ("other.json") resolves to another document, which is then refused,
// rather than back into this one.
const schemaURL = "gateway-schema:///arguments.json"

// errNoLoading is what the loader answers for any document but the schema's
// own (and the draft metaschemas, which the library embeds).
var errNoLoading = errors.New("loading schemas is not allowed")

type refusingLoader struct{}

func (refusingLoader) Load(string) (any, error) { return nil, errNoLoading }

// Compile compiles the JSON Schema of a tool's arguments written for
// this gateway (a built-in tool, a webhook tool's "parameters"). On top of
// being a valid schema (see Schema for drafts, references and formats), it
// must pass checks that catch mistakes which would otherwise make a schema
// validate less than its author thinks:
//
//   - the root is {"type": "object", ...};
//   - every keyword is one of the draft's (a misspelt "maxLenght" or an
//     OpenAPI "nullable" is an error, not an ignored annotation);
//   - a "format" is one the gateway checks;
//   - a keyword for one type ("maxLength", "minimum", "items", "properties",
//     ...) is not used on a schema whose "type" excludes that type, and every
//     "enum"/"const" value has one of the declared types;
//   - every name in "required" is declared in a "properties" of the
//     schema (unless the object it is on has "patternProperties" or an
//     "additionalProperties" schema);
//   - before draft 2019-09, no keyword sits next to "$ref" (it would be
//     ignored).
//
// Errors say where in the schema the problem is, e.g.
// `schema of "to": unsupported type "strin"`.
func Compile(src json.RawMessage) (*Schema, error) { return compileSchema(src, true) }

// CompileExternal compiles a schema written by a third party, such as
// an MCP server's tool input schema: any valid schema is accepted (see
// Schema for drafts, references and formats). Unlike Compile it
// neither requires a root "type": "object" nor refuses unknown keywords or
// formats, which are annotations there, as the specification says; Validate
// still accepts only a JSON object of arguments.
func CompileExternal(src json.RawMessage) (*Schema, error) { return compileSchema(src, false) }

// MustCompile is Compile for schemas written in the source; it
// panics on error.
func MustCompile(src string) *Schema {
	s, err := Compile(json.RawMessage(src))
	if err != nil {
		panic(err)
	}
	return s
}

// JSON returns the schema as compact JSON (for Spec.Parameters).
func (s *Schema) JSON() json.RawMessage { return append(json.RawMessage(nil), s.raw...) }

func compileSchema(src json.RawMessage, strict bool) (*Schema, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, src); err != nil {
		return nil, fmt.Errorf("schema: not valid JSON: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(src))
	if err != nil {
		return nil, fmt.Errorf("schema: not valid JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refusingLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.RegisterFormat(&jsonschema.Format{Name: "email", Validate: validateEmail})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, compileError(doc, err)
	}
	if loc := refCycle(sch.Validate(map[string]any{})); loc != "" {
		return nil, fmt.Errorf("schema: its references loop without end (through %q)", shownURL(loc))
	}
	if strict && !rootIsObject(doc) {
		return nil, errors.New(`schema: the root must have "type": "object"`)
	}
	if strict {
		if msg := lintSchema(doc, sch); msg != "" {
			return nil, errors.New(msg)
		}
	}
	return &Schema{raw: json.RawMessage(buf.Bytes()), sch: sch}, nil
}

// refCycle returns the location of a schema the error says is reached
// again through references, without the value changing, or "".
func refCycle(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return ""
	}
	if k, ok := ve.ErrorKind.(*kind.RefCycle); ok {
		return k.URL
	}
	for _, c := range ve.Causes {
		if loc := refCycle(c); loc != "" {
			return loc
		}
	}
	return ""
}

func rootIsObject(doc any) bool {
	m, ok := doc.(map[string]any)
	return ok && m["type"] == "object"
}

func validateEmail(v any) error {
	if s, ok := v.(string); ok && !isEmail(s) {
		return errors.New("not an email address")
	}
	return nil
}

// Validate checks args against the schema and returns them re-encoded:
// compact, object keys sorted, HTML characters not escaped, and every
// number that a "type": "integer" or "number" of the schema applies to in
// canonical form (integers as such, within int64; numbers as the shortest
// float64 form). The same arguments written differently (spacing, key
// order, 5 vs 5.0 for an integer) give the same bytes; numbers the schema
// does not type are kept as written. A number typed integer or number that
// does not fit (1e400, or an integer beyond int64) is refused as out of
// range. A failure is an *InvalidArgs whose reason a user (or the model)
// can act on: it names the field, e.g. `field "addr.city" is required`.
func (s *Schema) Validate(args json.RawMessage) (json.RawMessage, error) {
	if len(args) > MaxArgsBytes {
		return nil, &tools.InvalidArgs{Reason: fmt.Sprintf("arguments are larger than %d KiB", MaxArgsBytes>>10)}
	}
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || !json.Valid(trimmed) {
		return nil, &tools.InvalidArgs{Reason: "arguments are not valid JSON"}
	}
	if trimmed[0] != '{' {
		return nil, &tools.InvalidArgs{Reason: "arguments must be a JSON object"}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(trimmed))
	if err != nil {
		return nil, &tools.InvalidArgs{Reason: "arguments are not valid JSON"}
	}
	norm, reason := canonical(doc, []*jsonschema.Schema{s.sch}, "")
	if reason != "" {
		return nil, &tools.InvalidArgs{Reason: reason}
	}
	if err := s.sch.Validate(norm); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return nil, &tools.InvalidArgs{Reason: err.Error()}
		}
		return nil, &tools.InvalidArgs{Reason: argsProblems(ve, norm)}
	}
	out, err := Compact(norm)
	if err != nil {
		return nil, &tools.InvalidArgs{Reason: "arguments cannot be encoded: " + err.Error()}
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

func joinPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func subject(path string) string {
	if path == "" {
		return "arguments"
	}
	return "field " + strconv.Quote(path)
}

// canonical returns v with the numbers typed by the schemas ss (those that
// apply to v) in canonical form, or the reason a number is out of range.
// path names v in messages. Subtrees no schema applies to are returned as
// they are.
func canonical(v any, ss []*jsonschema.Schema, path string) (any, string) {
	ss = inPlace(ss, v)
	if len(ss) == 0 {
		return v, ""
	}
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make(map[string]any, len(v))
		for _, k := range keys {
			c, reason := canonical(v[k], propertySchemas(ss, k), joinPath(path, k))
			if reason != "" {
				return nil, reason
			}
			out[k] = c
		}
		return out, ""
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, reason := canonical(e, itemSchemas(ss, i), fmt.Sprintf("%s[%d]", path, i))
			if reason != "" {
				return nil, reason
			}
			out[i] = c
		}
		return out, ""
	case json.Number:
		return canonicalNumber(v, ss, path)
	}
	return v, ""
}

var integerType, numberType = types("integer"), types("number")

func types(name string) jsonschema.Types {
	var t jsonschema.Types
	t.Add(name)
	return t
}

func hasType(ss []*jsonschema.Schema, t jsonschema.Types) bool {
	for _, s := range ss {
		if s.Types != nil && *s.Types&t != 0 {
			return true
		}
	}
	return false
}

func canonicalNumber(num json.Number, ss []*jsonschema.Schema, path string) (any, string) {
	isInt, isNum := hasType(ss, integerType), hasType(ss, numberType)
	if !isInt && !isNum {
		return num, ""
	}
	f, err := strconv.ParseFloat(num.String(), 64)
	if err != nil || math.IsInf(f, 0) {
		return nil, subject(path) + " is out of range"
	}
	if isInt && f == math.Trunc(f) {
		i, err := strconv.ParseInt(num.String(), 10, 64)
		switch {
		case err == nil:
		case f >= -(1<<63) && f < 1<<63:
			i = int64(f) // 5.0 and 5e2 are integers too
		case !isNum:
			return nil, subject(path) + " is out of range"
		default:
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), ""
		}
		return json.Number(strconv.FormatInt(i, 10)), ""
	}
	if isNum {
		return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), ""
	}
	return num, "" // not an integer: the schema says so
}

// inPlace adds to ss the schemas that apply to the same value through
// "$ref", "allOf", "anyOf", "oneOf", "if"/"then"/"else" and dependent
// schemas, whether or not they match: the canonical form of a number must
// not depend on how it is written.
func inPlace(ss []*jsonschema.Schema, v any) []*jsonschema.Schema {
	if !slices.ContainsFunc(ss, hasInPlace) {
		return ss
	}
	obj, _ := v.(map[string]any)
	var out []*jsonschema.Schema
	var add func(s *jsonschema.Schema)
	add = func(s *jsonschema.Schema) {
		if s == nil || slices.Contains(out, s) {
			return
		}
		out = append(out, s)
		add(s.Ref)
		add(s.RecursiveRef)
		if s.DynamicRef != nil {
			add(s.DynamicRef.Ref)
		}
		for _, l := range [][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf} {
			for _, x := range l {
				add(x)
			}
		}
		add(s.If)
		add(s.Then)
		add(s.Else)
		for name, x := range s.DependentSchemas {
			if _, ok := obj[name]; ok {
				add(x)
			}
		}
		for name, x := range s.Dependencies {
			if x, ok := x.(*jsonschema.Schema); ok {
				if _, ok := obj[name]; ok {
					add(x)
				}
			}
		}
	}
	for _, s := range ss {
		add(s)
	}
	return out
}

func hasInPlace(s *jsonschema.Schema) bool {
	return s.Ref != nil || s.RecursiveRef != nil || s.DynamicRef != nil ||
		len(s.AllOf)+len(s.AnyOf)+len(s.OneOf) > 0 || s.If != nil ||
		len(s.DependentSchemas) > 0 || len(s.Dependencies) > 0
}

// propertySchemas returns the schemas of ss that apply to the property name.
func propertySchemas(ss []*jsonschema.Schema, name string) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	for _, s := range ss {
		matched := false
		if p, ok := s.Properties[name]; ok {
			out, matched = append(out, p), true
		}
		for re, p := range s.PatternProperties {
			if re.MatchString(name) {
				out, matched = append(out, p), true
			}
		}
		if !matched {
			if p, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
				out = append(out, p)
			}
			if s.UnevaluatedProperties != nil {
				out = append(out, s.UnevaluatedProperties)
			}
		}
	}
	return out
}

// itemSchemas returns the schemas of ss that apply to item i of an array.
func itemSchemas(ss []*jsonschema.Schema, i int) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	add := func(s *jsonschema.Schema) {
		if s != nil {
			out = append(out, s)
		}
	}
	for _, s := range ss {
		if s.DraftVersion >= 2020 {
			if i < len(s.PrefixItems) {
				add(s.PrefixItems[i])
			} else {
				add(s.Items2020)
			}
		} else {
			switch items := s.Items.(type) {
			case *jsonschema.Schema:
				add(items)
			case []*jsonschema.Schema:
				if i < len(items) {
					add(items[i])
				} else if more, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
					add(more)
				}
			}
		}
		add(s.UnevaluatedItems)
	}
	return out
}

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

// Tool is a tools.Tool whose Validate is its schema. Embed it in a tool
// (a built-in or a webhook tool) to get Spec and Validate.
type Tool struct {
	spec   tools.Spec
	schema *Schema
}

// NewTool compiles schema (with Compile) and returns a tool
// with spec, whose Parameters become the compiled schema's JSON. It checks
// that the spec has a name and a known contract.
func NewTool(spec tools.Spec, schema json.RawMessage) (*Tool, error) {
	if spec.Name == "" {
		return nil, errors.New("tool: empty name")
	}
	switch spec.Contract {
	case tools.Cancellable, tools.Idempotent, tools.Consequential:
	default:
		return nil, fmt.Errorf("tool %s: unknown contract %q", spec.Name, spec.Contract)
	}
	s, err := Compile(schema)
	if err != nil {
		return nil, fmt.Errorf("tool %s: %w", spec.Name, err)
	}
	spec.Parameters = s.JSON()
	return &Tool{spec: spec, schema: s}, nil
}

// MustTool is NewTool for a schema written in the tool's own
// source: a mistake there is a bug, so it panics.
func MustTool(spec tools.Spec, schema string) *Tool {
	t, err := NewTool(spec, json.RawMessage(schema))
	if err != nil {
		panic(err)
	}
	return t
}

// Spec implements tools.Tool.
func (t *Tool) Spec() tools.Spec {
	s := t.spec
	s.Parameters = t.schema.JSON()
	return s
}

// Validate implements tools.Tool.
func (t *Tool) Validate(args json.RawMessage) (json.RawMessage, error) {
	return t.schema.Validate(args)
}

// Schema returns the compiled schema.
func (t *Tool) Schema() *Schema { return t.schema }
