package schema

import (
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// The library reports a tree of errors (each keyword that failed, under the
// "$ref", "allOf", "anyOf", ... that led to it) in its own terse words
// ("minLength: got 1, want 2"). This file turns such a tree into one message
// for users and the model: each problem names the field it is about and
// says what was expected (`field "name" must be at least 2 characters
// long`); a few problems at most are listed, the first ones by location.

// maxProblems is how many problems one message lists.
const maxProblems = 3

// problem is one thing wrong with an instance (the arguments, or a schema
// checked against its metaschema).
type problem struct {
	loc  []string // where in the instance
	rank int      // 0 for a missing or unknown field: listed first at a location
	msg  string
	// types is set when the problem is only that the value is not of these
	// types (so that failed alternatives can say "a string or an integer").
	types []string
	// discriminator is set for a "const" (or one-value "enum") mismatch:
	// the likely tag of an alternative that was not meant.
	discriminator bool
	values        []any // the values a discriminator allows
}

// describer turns the library's errors into problems.
type describer struct {
	doc     any                       // the instance
	subject func(loc []string) string // `field "a.b"`, `schema of "a": "type"`
	schema  bool                      // the instance is a schema
}

// argsProblems describes why args (as decoded) failed validation.
func argsProblems(ve *jsonschema.ValidationError, args any) string {
	d := describer{doc: args, subject: func(loc []string) string { return subject(argPath(args, loc)) }}
	return summarize(d.collect(ve))
}

// argPath names the value at loc in args the way users write it: "addr.city",
// "tags[1]".
func argPath(args any, loc []string) string {
	path, v := "", args
	for _, tok := range loc {
		if arr, ok := v.([]any); ok {
			path += "[" + tok + "]"
			v = nil
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(arr) {
				v = arr[i]
			}
			continue
		}
		path = joinPath(path, tok)
		m, _ := v.(map[string]any)
		v = m[tok]
	}
	return path
}

// compileError turns the library's compile error into one message.
func compileError(doc any, err error) error {
	var sve *jsonschema.SchemaValidationError
	if errors.As(err, &sve) {
		if ve, ok := sve.Err.(*jsonschema.ValidationError); ok {
			d := describer{doc: doc, subject: schemaSubject, schema: true}
			return errors.New(summarize(d.collect(ve)))
		}
	}
	var le *jsonschema.LoadURLError
	if errors.As(err, &le) {
		return fmt.Errorf(`schema: cannot use %q: a "$ref" or "$schema" may only point inside the schema, such as "#/$defs/name" (schemas are never loaded from the network or from files)`, shownURL(le.URL))
	}
	var pnf *jsonschema.JSONPointerNotFoundError
	if errors.As(err, &pnf) {
		return fmt.Errorf(`schema: "$ref" %q points to nothing in the schema`, shownURL(pnf.URL))
	}
	var anf *jsonschema.AnchorNotFoundError
	if errors.As(err, &anf) {
		return fmt.Errorf(`schema: "$ref" %q points to an anchor the schema does not define`, shownURL(anf.Reference))
	}
	var ire *jsonschema.InvalidRegexError
	if errors.As(err, &ire) {
		return fmt.Errorf("%s: %q is not a valid regular expression: %v", schemaSubject(urlPointer(ire.URL)), ire.Regex, ire.Err)
	}
	return fmt.Errorf("schema: %s", strings.ReplaceAll(err.Error(), schemaURL, ""))
}

// shownURL is u as the schema's author wrote it, as far as can be told:
// without the name the compiler gives the schema document.
func shownURL(u string) string {
	if rest, ok := strings.CutPrefix(u, schemaURL); ok {
		return rest
	}
	if rest, ok := strings.CutPrefix(u, "gateway-schema:///"); ok {
		return rest
	}
	return u
}

// urlPointer returns the JSON pointer tokens of a location in the schema
// document ("gateway-schema:///arguments.json#/properties/a"), or nil.
func urlPointer(u string) []string {
	base, frag, ok := strings.Cut(u, "#")
	if !ok || base != schemaURL {
		return nil
	}
	toks, _ := pointerTokens(frag)
	return toks
}

// schema paths: the keywords whose values hold subschemas, by shape.
var (
	schemaMapKeywords  = wordSet("properties patternProperties $defs definitions dependentSchemas dependencies")
	schemaListKeywords = wordSet("allOf anyOf oneOf prefixItems items")
	schemaKeywords     = wordSet("items additionalProperties additionalItems not if then else contains propertyNames unevaluatedItems unevaluatedProperties contentSchema")
)

func wordSet(words string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(words) {
		m[w] = true
	}
	return m
}

// schemaSubject names loc, a location in a schema document: the subschema
// it is in and, if loc goes further, the keyword: `schema of "addr.city"`,
// `schema of "tags[]": "maxLength"`, `schema at "/$defs/x": "type"`.
func schemaSubject(loc []string) string {
	i := 0
walk:
	for i < len(loc) {
		tok, more := loc[i], i+1 < len(loc)
		switch {
		case schemaListKeywords[tok] && more && isIndex(loc[i+1]):
			i += 2
		case schemaMapKeywords[tok] && more:
			i += 2
		case schemaKeywords[tok] && more:
			i++
		default:
			break walk
		}
	}
	where := schemaWhere(loc[:i])
	if i == len(loc) {
		return where
	}
	return where + ": " + strconv.Quote(strings.Join(loc[i:], "/"))
}

// schemaWhere names the subschema at ptr: `schema` (the root), `schema of
// "addr.city"` or `schema of "tags[]"` (under "properties" and "items" only),
// or else `schema at "/$defs/x"`.
func schemaWhere(ptr []string) string {
	if len(ptr) == 0 {
		return "schema"
	}
	name := ""
	for i := 0; i < len(ptr); i++ {
		switch {
		case ptr[i] == "properties" && i+1 < len(ptr):
			name = joinPath(name, ptr[i+1])
			i++
		case ptr[i] == "items" && (i+1 == len(ptr) || !isIndex(ptr[i+1])):
			name += "[]"
		default:
			var b strings.Builder
			for _, tok := range ptr {
				b.WriteByte('/')
				b.WriteString(strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1"))
			}
			return "schema at " + strconv.Quote(b.String())
		}
	}
	return "schema of " + strconv.Quote(name)
}

func isIndex(tok string) bool {
	_, err := strconv.ParseUint(tok, 10, 31)
	return err == nil
}

// pointerTokens splits a URL fragment holding a JSON pointer into tokens.
func pointerTokens(frag string) ([]string, bool) {
	frag, err := url.PathUnescape(frag)
	if err != nil || (frag != "" && frag[0] != '/') {
		return nil, false
	}
	if frag == "" {
		return nil, true
	}
	toks := strings.Split(frag[1:], "/")
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, true
}

// collect returns the problems of e's tree.
func (d describer) collect(e *jsonschema.ValidationError) []problem {
	switch k := e.ErrorKind.(type) {
	case *kind.Schema, *kind.Group, *kind.AllOf, *kind.Reference:
		if len(e.Causes) == 0 {
			break
		}
		var out []problem
		for _, c := range e.Causes {
			out = append(out, d.collect(c)...)
		}
		return out
	case *kind.AnyOf:
		return d.alternatives(e)
	case *kind.OneOf:
		if len(k.Subschemas) == 0 {
			return d.alternatives(e)
		}
	}
	return d.leaf(e)
}

// alternatives describes an "anyOf" or "oneOf" that nothing matched. When
// every alternative wanted another type, it says which types would do;
// otherwise alternatives that failed only on the type, or on a "const" tag
// (when some did not), are taken as not meant, and if one is left its
// problems are the answer.
func (d describer) alternatives(e *jsonschema.ValidationError) []problem {
	loc := e.InstanceLocation
	var want []string
	var rest [][]problem
	for _, c := range e.Causes {
		ps := d.collect(c)
		if len(ps) == 0 {
			continue
		}
		if len(ps) == 1 && ps[0].types != nil && slices.Equal(ps[0].loc, loc) {
			for _, t := range ps[0].types {
				if !slices.Contains(want, t) {
					want = append(want, t)
				}
			}
			continue
		}
		rest = append(rest, ps)
	}
	if len(rest) == 0 {
		if len(want) == 0 {
			return []problem{{loc: loc, rank: 1, msg: d.subject(loc) + " does not match any of the allowed forms"}}
		}
		return []problem{{loc: loc, rank: 1, msg: d.subject(loc) + " must be " + typeList(want), types: want}}
	}
	if len(rest) > 1 {
		var untagged [][]problem
		var tags []problem
		for _, ps := range rest {
			if i := slices.IndexFunc(ps, func(p problem) bool { return p.discriminator }); i >= 0 {
				tags = append(tags, ps[i])
			} else {
				untagged = append(untagged, ps)
			}
		}
		if len(untagged) > 0 {
			rest = untagged
		} else if sameLoc(tags) {
			// Every alternative has another tag: say which tags there are.
			var values []any
			for _, t := range tags {
				values = append(values, t.values...)
			}
			l := tags[0].loc
			return []problem{{loc: l, rank: 1, msg: d.subject(l) + " must be one of " + valueList(values)}}
		}
	}
	if len(rest) == 1 {
		return rest[0]
	}
	var each []string
	for _, ps := range rest {
		sortProblems(ps)
		each = append(each, ps[0].msg)
	}
	return []problem{{loc: loc, rank: 1, msg: d.subject(loc) + " does not match any of the allowed forms: " + strings.Join(each, "; or ")}}
}

// leaf describes one failed keyword.
func (d describer) leaf(e *jsonschema.ValidationError) []problem {
	loc := e.InstanceLocation
	at := func(name string) []string { return append(slices.Clip(loc), name) }
	one := func(msg string) []problem { return []problem{{loc: loc, rank: 1, msg: d.subject(loc) + " " + msg}} }
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		var out []problem
		for _, name := range k.Missing {
			out = append(out, problem{loc: at(name), msg: d.subject(at(name)) + " is required"})
		}
		return out
	case *kind.AdditionalProperties:
		var out []problem
		for _, name := range k.Properties {
			out = append(out, problem{loc: at(name), msg: "unknown " + d.subject(at(name))})
		}
		return out
	case *kind.DependentRequired:
		return d.dependent(loc, k.Prop, k.Missing)
	case *kind.Dependency:
		return d.dependent(loc, k.Prop, k.Missing)
	case *kind.FalseSchema:
		if strings.HasSuffix(e.SchemaURL, "/unevaluatedProperties") {
			return []problem{{loc: loc, msg: "unknown " + d.subject(loc)}}
		}
		return one("is not allowed")
	case *kind.Type:
		want := typeList(k.Want)
		if d.schema && slices.Equal(k.Want, []string{"boolean", "object"}) {
			want = "a schema (an object, or true or false)"
			if len(loc) > 0 && loc[len(loc)-1] == "items" && k.Got == "array" {
				want += `; since draft 2020-12 a list of item schemas is "prefixItems"`
			}
		}
		return []problem{{loc: loc, rank: 1, msg: d.subject(loc) + " must be " + want, types: k.Want}}
	case *kind.Enum:
		if d.schema && len(loc) > 0 && loc[len(loc)-1] == "type" {
			if name, ok := k.Got.(string); ok {
				return []problem{{loc: loc, rank: 1, msg: fmt.Sprintf("%s: unsupported type %q (the types are %s)",
					schemaSubject(loc[:len(loc)-1]), name, "array, boolean, integer, null, number, object and string")}}
			}
		}
		ps := one("must be one of " + valueList(k.Want))
		ps[0].discriminator, ps[0].values = len(k.Want) == 1, k.Want
		return ps
	case *kind.Const:
		ps := one("must be " + jsonText(k.Want))
		ps[0].discriminator, ps[0].values = true, []any{k.Want}
		return ps
	case *kind.PropertyNames:
		return d.propertyName(e, k.Property)
	case *kind.OneOf:
		return one(fmt.Sprintf("matches more than one of the allowed forms (%d and %d) where exactly one must match", k.Subschemas[0]+1, k.Subschemas[1]+1))
	}
	return one(phrase(e.ErrorKind))
}

// propertyName describes a "propertyNames" failure. The library's location
// for it can be wrong (it shares a slice that is reused later), so it is used
// only if the object there does have the property.
func (d describer) propertyName(e *jsonschema.ValidationError, name string) []problem {
	loc := e.InstanceLocation
	obj, _ := lookupPointer(d.doc, loc).(map[string]any)
	if _, ok := obj[name]; !ok {
		loc = nil
	}
	var why string
	if d.schema {
		// The metaschemas use "propertyNames" for "patternProperties" only.
		why = "is not a valid regular expression"
		for _, c := range e.Causes {
			for _, p := range (describer{doc: name, subject: func([]string) string { return "" }}).collect(c) {
				why = strings.TrimSpace(p.msg)
			}
		}
		if loc == nil {
			return []problem{{msg: fmt.Sprintf(`schema: the "patternProperties" name %q %s`, name, why)}}
		}
		return []problem{{loc: loc, rank: 1, msg: fmt.Sprintf("%s: the name %q %s", schemaSubject(loc), name, why)}}
	}
	if loc == nil {
		return []problem{{msg: fmt.Sprintf("the field name %q is not allowed", name)}}
	}
	return []problem{{loc: append(slices.Clip(loc), name), rank: 1, msg: fmt.Sprintf("%s has a field name that is not allowed: %q", d.subject(loc), name)}}
}

func sameLoc(ps []problem) bool {
	for _, p := range ps[1:] {
		if !slices.Equal(p.loc, ps[0].loc) {
			return false
		}
	}
	return true
}

func (d describer) dependent(loc []string, prop string, missing []string) []problem {
	var out []problem
	for _, name := range missing {
		l := append(slices.Clip(loc), name)
		out = append(out, problem{loc: l, msg: d.subject(l) + " is required when " + d.subject(append(slices.Clip(loc), prop)) + " is present"})
	}
	return out
}

// phrase says what a failed keyword wanted, after the subject.
func phrase(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Format:
		switch k.Want {
		case "email":
			return "must be an email address"
		case "regex":
			return fmt.Sprintf("must be a valid regular expression (%v)", k.Err)
		}
		return "must be a valid " + k.Want
	case *kind.MinLength:
		if k.Want == 1 {
			return "must not be empty"
		}
		return fmt.Sprintf("must be at least %d characters long", k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("must be at most %d characters long", k.Want)
	case *kind.Pattern:
		return "must match the pattern " + strconv.Quote(k.Want)
	case *kind.Minimum:
		return "must be at least " + ratText(k.Want)
	case *kind.Maximum:
		return "must be at most " + ratText(k.Want)
	case *kind.ExclusiveMinimum:
		return "must be greater than " + ratText(k.Want)
	case *kind.ExclusiveMaximum:
		return "must be less than " + ratText(k.Want)
	case *kind.MultipleOf:
		return "must be a multiple of " + ratText(k.Want)
	case *kind.MinItems:
		return fmt.Sprintf("must have at least %d %s", k.Want, plural(k.Want, "item"))
	case *kind.MaxItems:
		return fmt.Sprintf("must have at most %d %s", k.Want, plural(k.Want, "item"))
	case *kind.AdditionalItems:
		return fmt.Sprintf("has %d %s more than allowed", k.Count, plural(k.Count, "item"))
	case *kind.UniqueItems:
		return fmt.Sprintf("must not hold the same item twice (items %d and %d are equal)", k.Duplicates[0], k.Duplicates[1])
	case *kind.Contains:
		return "must contain at least one item of the required kind"
	case *kind.MinContains:
		return fmt.Sprintf("must contain at least %d %s of the required kind", k.Want, plural(k.Want, "item"))
	case *kind.MaxContains:
		return fmt.Sprintf("must contain at most %d %s of the required kind", k.Want, plural(k.Want, "item"))
	case *kind.MinProperties:
		return fmt.Sprintf("must have at least %d %s", k.Want, plural(k.Want, "field"))
	case *kind.MaxProperties:
		return fmt.Sprintf("must have at most %d %s", k.Want, plural(k.Want, "field"))
	case *kind.Not:
		return "has a value that is not allowed"
	case *kind.ContentEncoding:
		return "must be " + k.Want + " encoded"
	case *kind.ContentMediaType:
		return "must hold " + k.Want
	case *kind.ContentSchema:
		return "holds content that does not match its schema"
	case *kind.RefCycle:
		return "cannot be checked: the schema's references loop"
	}
	return "is not valid"
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// typeList says "a string", "a string or null", "a number, an array or an
// object".
func typeList(ts []string) string {
	words := make([]string, len(ts))
	for i, t := range ts {
		switch t {
		case "integer", "array", "object":
			words[i] = "an " + t
		case "boolean":
			words[i] = "true or false"
		case "null":
			words[i] = "null"
		default:
			words[i] = "a " + t
		}
	}
	return orList(words)
}

func orList(words []string) string {
	switch len(words) {
	case 0:
		return ""
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// valueList lists enum values as JSON: "red", "green".
func valueList(vs []any) string {
	const most = 10
	parts := make([]string, 0, most+1)
	for i, v := range vs {
		if i == most {
			parts = append(parts, fmt.Sprintf("… (%d values in all)", len(vs)))
			break
		}
		parts = append(parts, jsonText(v))
	}
	return strings.Join(parts, ", ")
}

func jsonText(v any) string {
	b, err := Compact(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// ratText writes a bound: exactly when it is an integer, else as the
// shortest float64 form (-1.5, 0.1).
func ratText(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// sortProblems orders problems by location (a field before the fields in
// it, array items by index), missing and unknown fields first.
func sortProblems(ps []problem) {
	slices.SortStableFunc(ps, func(a, b problem) int {
		for i := 0; i < len(a.loc) && i < len(b.loc); i++ {
			if c := compareTokens(a.loc[i], b.loc[i]); c != 0 {
				return c
			}
		}
		if c := len(a.loc) - len(b.loc); c != 0 {
			return c
		}
		if c := a.rank - b.rank; c != 0 {
			return c
		}
		return strings.Compare(a.msg, b.msg)
	})
}

func compareTokens(a, b string) int {
	if isIndex(a) && isIndex(b) {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	}
	return strings.Compare(a, b)
}

// summarize joins the first few problems into one message.
func summarize(ps []problem) string {
	if len(ps) == 0 {
		return "not valid"
	}
	sortProblems(ps)
	var msgs []string
	for _, p := range ps {
		if !slices.Contains(msgs, p.msg) {
			msgs = append(msgs, p.msg)
		}
	}
	if n := len(msgs) - maxProblems; n > 0 {
		return strings.Join(msgs[:maxProblems], "; ") + fmt.Sprintf("; and %d more %s", n, plural(n, "problem"))
	}
	return strings.Join(msgs, "; ")
}
