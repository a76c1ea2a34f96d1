package schema

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The checks Compile adds to the library's: each catches a schema
// that is valid but would validate less than its author thinks (see
// Compile).

// annotationKeywords are accepted in every draft, as they always were here.
const annotationKeywords = "title description default examples $schema $id $comment"

// draftKeywords are the keywords of each draft, by the library's
// DraftVersion: the properties its metaschema (and vocabularies) declare.
var draftKeywords = func() map[int]map[string]bool {
	d4 := "$ref $schema additionalItems additionalProperties allOf anyOf default definitions dependencies description enum exclusiveMaximum exclusiveMinimum format id items maxItems maxLength maxProperties maximum minItems minLength minProperties minimum multipleOf not oneOf pattern patternProperties properties required title type uniqueItems"
	d6 := d4 + " $id const contains examples propertyNames"
	d7 := d6 + " $comment contentEncoding contentMediaType else if then readOnly writeOnly"
	d2019 := "definitions dependencies $anchor $comment $defs $id $recursiveAnchor $recursiveRef $ref $schema $vocabulary" +
		" additionalItems additionalProperties allOf anyOf contains dependentSchemas else if items not oneOf patternProperties properties propertyNames then unevaluatedItems unevaluatedProperties" +
		" contentEncoding contentMediaType contentSchema default deprecated description examples readOnly title writeOnly format" +
		" const dependentRequired enum exclusiveMaximum exclusiveMinimum maxContains maxItems maxLength maxProperties maximum minContains minItems minLength minProperties minimum multipleOf pattern required type uniqueItems"
	d2020 := strings.Replace(d2019, " additionalItems ", " ", 1) + " $dynamicAnchor $dynamicRef prefixItems"
	out := map[int]map[string]bool{}
	for v, words := range map[int]string{4: d4, 6: d6, 7: d7, 2019: d2019, 2020: d2020} {
		out[v] = wordSet(words + " " + annotationKeywords)
	}
	return out
}()

func draftName(version int) string {
	switch version {
	case 2019:
		return "draft 2019-09"
	case 2020:
		return "draft 2020-12"
	}
	return fmt.Sprintf("draft-%02d", version)
}

// knownFormats are the formats the compiler checks ("email" is ours).
var knownFormats = wordSet("date date-time duration email hostname ipv4 ipv6 iri iri-reference json-pointer period regex relative-json-pointer semver time uri uri-reference uri-template uuid")

// keywordTypes maps the keywords that only act on one type to that type.
var keywordTypes = func() map[string]string {
	m := map[string]string{}
	for t, words := range map[string]string{
		"string": "minLength maxLength pattern contentEncoding contentMediaType contentSchema",
		"number": "minimum maximum exclusiveMinimum exclusiveMaximum multipleOf",
		"array":  "items prefixItems additionalItems contains minContains maxContains minItems maxItems uniqueItems unevaluatedItems",
		"object": "properties patternProperties additionalProperties required minProperties maxProperties dependentRequired dependentSchemas dependencies propertyNames unevaluatedProperties",
	} {
		for _, w := range strings.Fields(words) {
			m[w] = t
		}
	}
	return m
}()

// refSiblings may stand next to "$ref" before draft 2019-09, where the
// other keywords there are ignored.
var refSiblings = wordSet("$ref definitions readOnly writeOnly id " + annotationKeywords)

type schemaNode struct {
	s   *jsonschema.Schema
	ptr []string       // where in the document
	obj map[string]any // its source (nil for true and false)
}

// schemaNodes lists the compiled subschemas of the document doc (not those
// of metaschemas a "$ref" may name), in no particular order.
func schemaNodes(doc any, root *jsonschema.Schema) []schemaNode {
	var out []schemaNode
	seen := map[*jsonschema.Schema]bool{}
	var visit func(s *jsonschema.Schema)
	visit = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		if base, frag, _ := strings.Cut(s.Location, "#"); base == schemaURL {
			if ptr, ok := pointerTokens(frag); ok {
				obj, _ := lookupPointer(doc, ptr).(map[string]any)
				out = append(out, schemaNode{s, ptr, obj})
			}
		}
		for _, c := range subschemas(s) {
			visit(c)
		}
	}
	visit(root)
	return out
}

func lookupPointer(doc any, ptr []string) any {
	v := doc
	for _, tok := range ptr {
		switch c := v.(type) {
		case map[string]any:
			v = c[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil
			}
			v = c[i]
		default:
			return nil
		}
	}
	return v
}

// subschemas returns the schemas s refers to or holds.
func subschemas(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else, s.PropertyNames,
		s.UnevaluatedProperties, s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema}
	if s.DynamicRef != nil {
		out = append(out, s.DynamicRef.Ref)
	}
	out = append(out, s.AllOf...)
	out = append(out, s.AnyOf...)
	out = append(out, s.OneOf...)
	out = append(out, s.PrefixItems...)
	for _, c := range s.Properties {
		out = append(out, c)
	}
	for _, c := range s.PatternProperties {
		out = append(out, c)
	}
	for _, c := range s.DependentSchemas {
		out = append(out, c)
	}
	for _, c := range s.Dependencies {
		if c, ok := c.(*jsonschema.Schema); ok {
			out = append(out, c)
		}
	}
	for _, c := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
		switch c := c.(type) {
		case *jsonschema.Schema:
			out = append(out, c)
		case []*jsonschema.Schema:
			out = append(out, c...)
		}
	}
	return out
}

// lintSchema returns what is wrong with the compiled schema of doc by
// Compile's checks, or "".
func lintSchema(doc any, root *jsonschema.Schema) string {
	nodes := schemaNodes(doc, root)
	declared := map[string]bool{}
	for _, n := range nodes {
		for name := range n.s.Properties {
			declared[name] = true
		}
	}
	var found []problem
	for _, n := range nodes {
		if n.obj == nil {
			continue
		}
		where, draft := schemaWhere(n.ptr), n.s.DraftVersion
		add := func(format string, a ...any) {
			found = append(found, problem{loc: n.ptr, msg: where + ": " + fmt.Sprintf(format, a...)})
		}
		keys := make([]string, 0, len(n.obj))
		for k := range n.obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		known := draftKeywords[draft]
		_, hasRef := n.obj["$ref"]
		for _, k := range keys {
			switch {
			case !known[k]:
				add("keyword %q is not supported (it is not a %s keyword)", k, draftName(draft))
			case draft < 2019 && hasRef && !refSiblings[k]:
				add(`keyword %q next to "$ref" is ignored in %s: put both in an "allOf"`, k, draftName(draft))
			}
		}
		if f, ok := n.obj["format"].(string); ok && !knownFormats[f] {
			add("format %q is not supported (supported formats: %s)", f, strings.Join(slices.Sorted(maps.Keys(knownFormats)), ", "))
		}
		if n.s.Types != nil {
			declaredTypes := orList(n.s.Types.ToStrings())
			for _, k := range keys {
				if t, ok := keywordTypes[k]; ok && !typesAllow(*n.s.Types, t) {
					add("keyword %q has no effect on type %s", k, declaredTypes)
				}
			}
			if n.s.Enum != nil {
				for _, v := range n.s.Enum.Values {
					if !typesAllowValue(*n.s.Types, v) {
						add(`"enum" value %s does not match the type %s`, jsonText(v), declaredTypes)
					}
				}
			}
			if n.s.Const != nil && !typesAllowValue(*n.s.Types, *n.s.Const) {
				add(`"const" value %s does not match the type %s`, jsonText(*n.s.Const), declaredTypes)
			}
		}
		_, patterns := n.obj["patternProperties"]
		_, closedOrOpen := n.s.AdditionalProperties.(bool)
		if !patterns && (n.s.AdditionalProperties == nil || closedOrOpen) {
			for _, name := range n.s.Required {
				if !declared[name] {
					add(`required field %q has no entry in "properties"`, name)
				}
			}
		}
	}
	if len(found) == 0 {
		return ""
	}
	return summarize(found)
}

// typesAllow reports whether a keyword acting on type t can act on a
// schema of the declared types.
func typesAllow(declared jsonschema.Types, t string) bool {
	if t == "number" {
		return declared&(numberType|integerType) != 0
	}
	return declared&types(t) != 0
}

// typesAllowValue reports whether the decoded value v has one of the
// declared types (an integral number is an integer).
func typesAllowValue(declared jsonschema.Types, v any) bool {
	switch v := v.(type) {
	case nil:
		return declared&types("null") != 0
	case bool:
		return declared&types("boolean") != 0
	case string:
		return declared&types("string") != 0
	case []any:
		return declared&types("array") != 0
	case map[string]any:
		return declared&types("object") != 0
	case json.Number:
		if declared&numberType != 0 {
			return true
		}
		f, err := strconv.ParseFloat(v.String(), 64)
		return declared&integerType != 0 && err == nil && f == math.Trunc(f)
	}
	return false
}
