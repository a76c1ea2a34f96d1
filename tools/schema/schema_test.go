package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/honestcancel/gateway/tools"
)

const testSchema = `{
  "type": "object",
  "title": "test",
  "properties": {
    "to": {"type": "string", "format": "email"},
    "name": {"type": "string", "minLength": 2, "maxLength": 5},
    "n": {"type": "integer", "minimum": 1, "maximum": 20},
    "x": {"type": "number", "minimum": -1.5, "maximum": 2.5},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    "color": {"type": "string", "enum": ["red", "green"]},
    "addr": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}
  },
  "required": ["to"],
  "additionalProperties": false
}`

// validatesTo checks that s accepts in and gives it back normalised as want.
func validatesTo(t *testing.T, s *Schema, in, want string) {
	t.Helper()
	got, err := s.Validate(json.RawMessage(in))
	if err != nil {
		t.Errorf("Validate(%s): %v", in, err)
	} else if string(got) != want {
		t.Errorf("Validate(%s) = %s, want %s", in, got, want)
	}
}

func TestSchemaValidate(t *testing.T) {
	s := MustCompile(testSchema)
	good := []struct{ in, want string }{
		{`{"to":"ann@example.com"}`, `{"to":"ann@example.com"}`},
		{` { "n" : 5.0, "to":"ann@example.com" , "ok": false } `, `{"n":5,"ok":false,"to":"ann@example.com"}`},
		{`{"to":"a.b+c@mail.example.org","n":2e1,"x":1.50}`, `{"n":20,"to":"a.b+c@mail.example.org","x":1.5}`},
		{`{"to":"ann@example.com","name":"Zoë","tags":["a","<b>"],"color":"red","addr":{"city":"Köln"}}`,
			`{"addr":{"city":"Köln"},"color":"red","name":"Zoë","tags":["a","<b>"],"to":"ann@example.com"}`},
		{`{"to":"ann@example.com","tags":[]}`, `{"tags":[],"to":"ann@example.com"}`},
	}
	for _, c := range good {
		validatesTo(t, s, c.in, c.want)
	}

	bad := []struct{ in, reason string }{
		{``, "arguments are not valid JSON"},
		{`{"to":`, "arguments are not valid JSON"},
		{`{"to":"ann@example.com"} {}`, "arguments are not valid JSON"},
		{`[1]`, "arguments must be a JSON object"},
		{`"x"`, "arguments must be a JSON object"},
		{`null`, "arguments must be a JSON object"},
		{`{}`, `field "to" is required`},
		{`{"to":"ann@example.com","zzz":1}`, `unknown field "zzz"`},
		{`{"to":"not an address"}`, `field "to" must be an email address`},
		{`{"to":"Ann <ann@example.com>"}`, `field "to" must be an email address`},
		{`{"to":" ann@example.com"}`, `field "to" must be an email address`},
		{`{"to":"ann@localhost"}`, `field "to" must be an email address`},
		{`{"to":5}`, `field "to" must be a string`},
		{`{"to":"ann@example.com","name":"Z"}`, `field "name" must be at least 2 characters long`},
		{`{"to":"ann@example.com","name":"Zoë123"}`, `field "name" must be at most 5 characters long`},
		{`{"to":"ann@example.com","n":"5"}`, `field "n" must be an integer`},
		{`{"to":"ann@example.com","n":1.5}`, `field "n" must be an integer`},
		{`{"to":"ann@example.com","n":0}`, `field "n" must be at least 1`},
		{`{"to":"ann@example.com","n":21}`, `field "n" must be at most 20`},
		{`{"to":"ann@example.com","n":1e400}`, `field "n" is out of range`},
		{`{"to":"ann@example.com","x":-2}`, `field "x" must be at least -1.5`},
		{`{"to":"ann@example.com","x":true}`, `field "x" must be a number`},
		{`{"to":"ann@example.com","ok":"yes"}`, `field "ok" must be true or false`},
		{`{"to":"ann@example.com","tags":"a"}`, `field "tags" must be an array`},
		{`{"to":"ann@example.com","tags":["a","b","c"]}`, `field "tags" must have at most 2 items`},
		{`{"to":"ann@example.com","tags":["a","long"]}`, `field "tags[1]" must be at most 3 characters long`},
		{`{"to":"ann@example.com","color":"blue"}`, `field "color" must be one of "red", "green"`},
		{`{"to":"ann@example.com","addr":[]}`, `field "addr" must be an object`},
		{`{"to":"ann@example.com","addr":{}}`, `field "addr.city" is required`},
		{`{"to":"ann@example.com","addr":{"city":"X","zip":1}}`, `unknown field "addr.zip"`},
		{`{"to":"ann@example.com","name":"` + strings.Repeat("a", MaxArgsBytes) + `"}`, "arguments are larger than 64 KiB"},
	}
	for _, c := range bad {
		_, err := s.Validate(json.RawMessage(c.in))
		var ia *tools.InvalidArgs
		if !errors.As(err, &ia) {
			t.Errorf("Validate(%.60s): err = %v, want *InvalidArgs", c.in, err)
			continue
		}
		if ia.Reason != c.reason {
			t.Errorf("Validate(%.60s): reason %q, want %q", c.in, ia.Reason, c.reason)
		}
	}
}

func TestSchemaOpenObject(t *testing.T) {
	s := MustCompile(`{"type":"object","properties":{"a":{"type":"integer"}}}`)
	got, err := s.Validate(json.RawMessage(`{"z":{"y":1,"x":[1.0]},"a":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":3,"z":{"x":[1.0],"y":1}}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestCompileSchemaErrors(t *testing.T) {
	bad := []struct{ src, want string }{
		{`nope`, "schema: not valid JSON"},
		{`{"type":"string"}`, `schema: the root must have "type": "object"`},
		{`{"properties":{}}`, `schema: the root must have "type": "object"`},
		{`{"type":"object","properties":{"a":{"type":"date"}}}`, `schema of "a": unsupported type "date" (the types are array, boolean, integer, null, number, object and string)`},
		{`{"type":5}`, `schema: "type" must be one of "array", "boolean", "integer", "null", "number", "object", "string"`},
		{`{"type":"object","properties":{"a":{"type":"string","pattern":"("}}}`, "schema of \"a\": \"pattern\" must be a valid regular expression (error parsing regexp: missing closing ): `(`)"},
		{`{"type":"object","patternProperties":{"(":{}}}`, `"patternProperties" name "(" must be a valid regular expression`},
		{`{"type":"object","properties":{"a":{"type":"string","format":"colour"}}}`, `schema of "a": format "colour" is not supported (supported formats: date, date-time,`},
		{`{"type":"object","properties":{"a":{"type":"string","maxLength":-1}}}`, `schema of "a": "maxLength" must be at least 0`},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"array","items":{"minLength":"x"}}}}}}`, `schema of "a.b[]": "minLength" must be an integer`},
		{`{"type":"object","properties":{"a":{"type":"integer","maxLength":3}}}`, `schema of "a": keyword "maxLength" has no effect on type integer`},
		{`{"type":"object","properties":{"a":{"type":"string","maxLenght":3}}}`, `schema of "a": keyword "maxLenght" is not supported (it is not a draft 2020-12 keyword)`},
		{`{"type":"object","properties":{"a":{"type":"string","nullable":true}}}`, `schema of "a": keyword "nullable" is not supported`},
		{`{"type":"object","required":["a"]}`, `schema: required field "a" has no entry in "properties"`},
		{`{"type":"object","properties":{"a":{"type":"integer","enum":["x"]}}}`, `schema of "a": "enum" value "x" does not match the type integer`},
		{`{"type":"object","properties":{"a":{"type":"integer","const":1.5}}}`, `schema of "a": "const" value 1.5 does not match the type integer`},
		{`{"type":"object","properties":{"a":5}}`, `schema of "a" must be a schema (an object, or true or false)`},
		{`{"type":"object","properties":{"a":{"type":"array","items":[{"type":"string"}]}}}`, `schema of "a": "items" must be a schema (an object, or true or false); since draft 2020-12 a list of item schemas is "prefixItems"`},
		{`{"type":"object","required":[5]}`, `schema: "required/0" must be a string`},
		{`{"type":"object","$defs":{"x":{"type":"strin"}},"properties":{"a":{"$ref":"#/$defs/x"}}}`, `schema at "/$defs/x": unsupported type "strin"`},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/nope"}}}`, `schema: "$ref" "#/$defs/nope" points to nothing in the schema`},
		{`{"type":"object","properties":{"a":{"$ref":"#nope"}}}`, `schema: "$ref" "#nope" points to an anchor the schema does not define`},
		{`{"type":"object","allOf":[{"$ref":"#"}]}`, `schema: its references loop without end (through "#")`},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"a":{"$ref":"#/definitions/s","maxLength":3}},"definitions":{"s":{"type":"string"}}}`,
			`schema of "a": keyword "maxLength" next to "$ref" is ignored in draft-07: put both in an "allOf"`},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"a":{"prefixItems":[]}}}`, `keyword "prefixItems" is not supported (it is not a draft-07 keyword)`},
	}
	for _, c := range bad {
		_, err := Compile(json.RawMessage(c.src))
		if err == nil {
			t.Errorf("Compile(%s) succeeded", c.src)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%s):\n got %v\nwant %s", c.src, err, c.want)
		}
	}
}

// The hand-written subset refused these; they are valid draft 2020-12 and
// now compile.
func TestCompileSchemaFullVocabulary(t *testing.T) {
	for _, src := range []string{
		`{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}`,
		`{"type":"object","properties":{"a":{"type":"string","format":"uri"}}}`,
		`{"type":"object","additionalProperties":{"type":"string"}}`,
		`{"type":"object","enum":[{}]}`,
		`{"type":"object","properties":{"a":{"type":["string","null"]}}}`,
		`{"type":"object","properties":{"a":{}},"oneOf":[{"required":["a"]},{"not":{"required":["a"]}}]}`,
		`{"$id":"https://example.com/tool.json","type":"object","properties":{"a":{"$ref":"#/$defs/s"},"b":{"$ref":"https://example.com/tool.json#/$defs/s"},"c":{"$ref":"#pos"}},"$defs":{"s":{"type":"string"},"p":{"$anchor":"pos","type":"integer","minimum":0}}}`,
		`{"type":"object","properties":{"t":{"type":"object","properties":{"v":{"$ref":"#/properties/t"}}}}}`,
	} {
		if _, err := Compile(json.RawMessage(src)); err != nil {
			t.Errorf("Compile(%s): %v", src, err)
		}
	}
}

// fullSchema uses keywords the hand-written subset did not have.
const fullSchema = `{
  "type": "object",
  "properties": {
    "kind": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "shape": {"oneOf": [
      {"type": "object", "properties": {"type": {"const": "circle"}, "r": {"type": "number", "exclusiveMinimum": 0}}, "required": ["type", "r"], "additionalProperties": false},
      {"type": "object", "properties": {"type": {"const": "square"}, "side": {"type": "number"}}, "required": ["type", "side"], "additionalProperties": false}
    ]},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
    "addr": {"$ref": "#/$defs/addr"},
    "v": {"const": 1},
    "opt": {"type": ["string", "null"]},
    "xs": {"type": "array", "uniqueItems": true, "prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
    "m": {"type": "number", "multipleOf": 0.5},
    "u": {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": false},
    "dep": {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
    "when": {"type": "string", "format": "date-time"},
    "tag": {"type": "string", "minLength": 1},
    "n": {"allOf": [{"$ref": "#/$defs/count"}]}
  },
  "if": {"properties": {"kind": {"const": "gift"}}, "required": ["kind"]},
  "then": {"required": ["tag"]},
  "$defs": {
    "addr": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "count": {"type": "integer", "minimum": 1}
  }
}`

func TestSchemaFullVocabulary(t *testing.T) {
	s := MustCompile(fullSchema)
	good := []struct{ in, want string }{
		{`{"kind":"a","shape":{"r":0.5,"type":"circle"},"code":"ABC","addr":{"city":"Köln"},"v":1.0,"opt":null}`,
			`{"addr":{"city":"Köln"},"code":"ABC","kind":"a","opt":null,"shape":{"r":0.5,"type":"circle"},"v":1.0}`},
		{`{"kind":7.0,"xs":[1.0,"a","b"],"m":1.50,"u":{"a":[1.0]},"dep":{"a":1,"b":2},"when":"2024-05-01T10:00:00Z"}`,
			`{"dep":{"a":1,"b":2},"kind":7,"m":1.5,"u":{"a":[1.0]},"when":"2024-05-01T10:00:00Z","xs":[1,"a","b"]}`},
		{`{"kind":"gift","tag":"x","n":3.0}`, `{"kind":"gift","n":3,"tag":"x"}`},
		{`{"shape":{"type":"square","side":2e0}}`, `{"shape":{"side":2,"type":"square"}}`},
	}
	for _, c := range good {
		validatesTo(t, s, c.in, c.want)
	}
	bad := []struct{ in, reason string }{
		{`{"kind":true}`, `field "kind" must be a string or an integer`},
		{`{"shape":{"type":"circle","r":0}}`, `field "shape.r" must be greater than 0`},
		{`{"shape":{"type":"square"}}`, `field "shape.side" is required`},
		{`{"shape":{"type":"tri"}}`, `field "shape.type" must be one of "circle", "square"`},
		{`{"shape":{"type":"circle","r":1,"side":1}}`, `unknown field "shape.side"`},
		{`{"code":"ab"}`, `field "code" must match the pattern "^[A-Z]{3}$"`},
		{`{"addr":{}}`, `field "addr.city" is required`},
		{`{"v":2}`, `field "v" must be 1`},
		{`{"opt":3}`, `field "opt" must be null or a string`},
		{`{"xs":[1.5]}`, `field "xs[0]" must be an integer`},
		{`{"xs":[1,2]}`, `field "xs[1]" must be a string`},
		{`{"xs":[1,"a","a"]}`, `field "xs" must not hold the same item twice (items 1 and 2 are equal)`},
		{`{"m":0.3}`, `field "m" must be a multiple of 0.5`},
		{`{"u":{"a":1,"b":2}}`, `unknown field "u.b"`},
		{`{"dep":{"a":1}}`, `field "dep.b" is required when field "dep.a" is present`},
		{`{"when":"yesterday"}`, `field "when" must be a valid date-time`},
		{`{"kind":"gift"}`, `field "tag" is required`},
		{`{"n":0}`, `field "n" must be at least 1`},
		{`{"n":1e30}`, `field "n" is out of range`},
		// Several problems: the first few, by field.
		{`{"code":"ab","addr":{},"v":2,"opt":3,"m":0.3}`,
			`field "addr.city" is required; field "code" must match the pattern "^[A-Z]{3}$"; field "m" must be a multiple of 0.5; and 2 more problems`},
	}
	for _, c := range bad {
		_, err := s.Validate(json.RawMessage(c.in))
		var ia *tools.InvalidArgs
		if !errors.As(err, &ia) {
			t.Errorf("Validate(%s): err = %v, want *InvalidArgs", c.in, err)
		} else if ia.Reason != c.reason {
			t.Errorf("Validate(%s):\n reason %q\n   want %q", c.in, ia.Reason, c.reason)
		}
	}
}

// Nothing is loaded to resolve a reference: not from the network, not from
// files.
func TestCompileSchemaLoadsNothing(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/schema+json")
		io.WriteString(w, `{"type":"string"}`)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "s.json")
	if err := os.WriteFile(file, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ src, shown string }{
		{`{"type":"object","properties":{"a":{"$ref":"` + srv.URL + `/s.json"}}}`, srv.URL + "/s.json"},
		{`{"type":"object","properties":{"a":{"$ref":"file://` + file + `"}}}`, "file://" + file},
		{`{"type":"object","properties":{"a":{"$ref":"s.json"}}}`, "s.json"},
		{`{"$id":"` + srv.URL + `/tool.json","type":"object","properties":{"a":{"$ref":"s.json#/x"}}}`, srv.URL + "/s.json"},
		{`{"$schema":"` + srv.URL + `/meta.json","type":"object"}`, srv.URL + "/meta.json"},
		{`{"type":"object","properties":{"a":{"$dynamicRef":"` + srv.URL + `/s.json#x"}}}`, srv.URL + "/s.json"},
	}
	for _, c := range cases {
		for _, compile := range []func(json.RawMessage) (*Schema, error){Compile, CompileExternal} {
			_, err := compile(json.RawMessage(c.src))
			want := `schema: cannot use "` + c.shown + `": a "$ref" or "$schema" may only point inside the schema, such as "#/$defs/name" (schemas are never loaded from the network or from files)`
			if err == nil || err.Error() != want {
				t.Errorf("compile(%s):\n got %v\nwant %s", c.src, err, want)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the server was asked %d times", n)
	}
}

// Compile refuses schemas that are valid but would validate less than
// their author thinks; CompileExternal, for schemas from elsewhere,
// takes them as the specification says.
func TestCompileExternalSchema(t *testing.T) {
	lenient := []struct{ src, args, want string }{
		{`{"type":"object","properties":{"a":{"type":"string","maxLenght":1,"nullable":true,"x-vendor":{}}}}`, `{"a":"abc"}`, `{"a":"abc"}`},
		{`{"type":"object","properties":{"a":{"type":"string","format":"colour"}}}`, `{"a":"anything"}`, `{"a":"anything"}`},
		{`{"type":"object","properties":{"a":{"type":"integer","maxLength":1}}}`, `{"a":12345}`, `{"a":12345}`},
		{`{"type":"object","required":["a"]}`, `{"a":5.0}`, `{"a":5.0}`},
		{`{"properties":{"a":{"type":"integer"}}}`, `{"a":5.0}`, `{"a":5}`},
		{`true`, `{"b":1}`, `{"b":1}`},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"a":{"$ref":"#/definitions/s","maxLength":1}},"definitions":{"s":{"type":"string"}}}`, `{"a":"abc"}`, `{"a":"abc"}`},
	}
	for _, c := range lenient {
		if _, err := Compile(json.RawMessage(c.src)); err == nil {
			t.Errorf("Compile(%s) succeeded", c.src)
		}
		s, err := CompileExternal(json.RawMessage(c.src))
		if err != nil {
			t.Errorf("CompileExternal(%s): %v", c.src, err)
			continue
		}
		if got, err := s.Validate(json.RawMessage(c.args)); err != nil || string(got) != c.want {
			t.Errorf("Validate(%s) with %s = %s, %v; want %s", c.args, c.src, got, err, c.want)
		}
	}
	// Formats it knows are still checked, formats are not the only thing
	// checked, arguments must still be an object, and an invalid schema is
	// still refused.
	s, err := CompileExternal(json.RawMessage(`{"type":"object","properties":{"to":{"type":"string","format":"email"},"n":{"type":"integer"}},"required":["n"]}`))
	if err != nil {
		t.Fatal(err)
	}
	for in, reason := range map[string]string{
		`{"n":1,"to":"ann@localhost"}`: `field "to" must be an email address`,
		`{}`:                           `field "n" is required`,
		`[1]`:                          "arguments must be a JSON object",
	} {
		var ia *tools.InvalidArgs
		if _, err := s.Validate(json.RawMessage(in)); !errors.As(err, &ia) || ia.Reason != reason {
			t.Errorf("Validate(%s): %v, want %s", in, err, reason)
		}
	}
	if _, err := CompileExternal(json.RawMessage(`{"type":5}`)); err == nil || !strings.Contains(err.Error(), `schema: "type" must be one of`) {
		t.Errorf("invalid schema: %v", err)
	}
}

// Numbers the schema types are canonical and must fit: integers in int64
// (exactly), numbers in float64. Numbers it does not type are kept as they
// are written.
func TestSchemaNumbers(t *testing.T) {
	s := MustCompile(`{"type":"object","properties":{
		"i": {"type": "integer"},
		"f": {"type": "number"},
		"either": {"type": ["integer", "number"]},
		"ref": {"$ref": "#/$defs/int"},
		"alt": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
		"list": {"type": "array", "items": {"type": "number"}},
		"free": {}
	},"$defs":{"int":{"type":"integer"}}}`)
	good := []struct{ in, want string }{
		{`{"i":9007199254740993}`, `{"i":9007199254740993}`},
		{`{"i":9223372036854775807}`, `{"i":9223372036854775807}`},
		{`{"i":-9223372036854775808}`, `{"i":-9223372036854775808}`},
		{`{"i":5.0,"f":1.50,"either":2e1,"ref":3.0,"alt":4.0,"list":[1.0,2.50,1e2]}`, `{"alt":4,"either":20,"f":1.5,"i":5,"list":[1,2.5,100],"ref":3}`},
		{`{"either":1e30,"f":0.1}`, `{"either":1e+30,"f":0.1}`},
		{`{"free":12345678901234567890123.50,"other":[1.0,-0.0]}`, `{"free":12345678901234567890123.50,"other":[1.0,-0.0]}`},
	}
	for _, c := range good {
		validatesTo(t, s, c.in, c.want)
	}
	bad := []struct{ in, reason string }{
		{`{"i":9223372036854775808}`, `field "i" is out of range`},
		{`{"i":1e19}`, `field "i" is out of range`},
		{`{"i":1e400}`, `field "i" is out of range`},
		{`{"f":-1e400}`, `field "f" is out of range`},
		{`{"ref":1e400}`, `field "ref" is out of range`},
		{`{"list":[1,1e999]}`, `field "list[1]" is out of range`},
		{`{"i":0.5}`, `field "i" must be an integer`},
		{`{"alt":0.5}`, `field "alt" must be an integer or a string`},
	}
	for _, c := range bad {
		_, err := s.Validate(json.RawMessage(c.in))
		var ia *tools.InvalidArgs
		if !errors.As(err, &ia) || ia.Reason != c.reason {
			t.Errorf("Validate(%s): %v, want reason %q", c.in, err, c.reason)
		}
	}
}

// A "$schema" naming an earlier draft is honoured; without one, the schema
// is draft 2020-12.
func TestSchemaDrafts(t *testing.T) {
	cases := []struct{ src, good, want, bad, reason string }{
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"p":{"type":"array","items":[{"type":"integer"},{"type":"string"}],"additionalItems":false}}}`,
			`{"p":[1.0,"a"]}`, `{"p":[1,"a"]}`, `{"p":[1,"a",true]}`, `field "p" has 1 item more than allowed`},
		{`{"$schema":"http://json-schema.org/draft-04/schema#","type":"object","properties":{"n":{"type":"number","maximum":5,"exclusiveMaximum":true}}}`,
			`{"n":4.5}`, `{"n":4.5}`, `{"n":5}`, `field "n" must be less than 5`},
		{`{"$schema":"https://json-schema.org/draft/2019-09/schema","type":"object","properties":{"a":{"type":"string"}},"unevaluatedProperties":false}`,
			`{"a":"x"}`, `{"a":"x"}`, `{"b":1}`, `unknown field "b"`},
		{`{"type":"object","properties":{"p":{"type":"array","prefixItems":[{"type":"integer"}],"items":false}}}`,
			`{"p":[1]}`, `{"p":[1]}`, `{"p":[1,2]}`, `field "p[1]" is not allowed`},
	}
	for _, c := range cases {
		s, err := Compile(json.RawMessage(c.src))
		if err != nil {
			t.Errorf("Compile(%s): %v", c.src, err)
			continue
		}
		if got, err := s.Validate(json.RawMessage(c.good)); err != nil || string(got) != c.want {
			t.Errorf("Validate(%s) = %s, %v; want %s", c.good, got, err, c.want)
		}
		var ia *tools.InvalidArgs
		if _, err := s.Validate(json.RawMessage(c.bad)); !errors.As(err, &ia) || ia.Reason != c.reason {
			t.Errorf("Validate(%s): %v, want reason %q", c.bad, err, c.reason)
		}
	}
}

// A Schema is used by many runs at once.
func TestSchemaConcurrent(t *testing.T) {
	s := MustCompile(fullSchema)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				args := fmt.Sprintf(`{"kind":%d.0,"shape":{"type":"circle","r":%d},"addr":{"city":"c%d"}}`, g, i+1, i)
				want := fmt.Sprintf(`{"addr":{"city":"c%d"},"kind":%d,"shape":{"r":%d,"type":"circle"}}`, i, g, i+1)
				if got, err := s.Validate(json.RawMessage(args)); err != nil || string(got) != want {
					t.Errorf("Validate(%s) = %s, %v", args, got, err)
					return
				}
				if _, err := s.Validate(json.RawMessage(`{"shape":{"type":"tri"}}`)); err == nil {
					t.Error("bad shape accepted")
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestNewSchemaTool(t *testing.T) {
	tool, err := NewTool(tools.Spec{Name: "hook", Description: "d", Contract: tools.Cancellable},
		json.RawMessage(`{ "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"] }`))
	if err != nil {
		t.Fatal(err)
	}
	var _ tools.Tool = tool
	if got := string(tool.Spec().Parameters); got != `{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}` {
		t.Errorf("Parameters = %s", got)
	}
	if _, err := tool.Validate(json.RawMessage(`{}`)); err == nil {
		t.Error("missing q accepted")
	}
	if _, err := NewTool(tools.Spec{Name: "x", Contract: "maybe"}, json.RawMessage(`{"type":"object"}`)); err == nil {
		t.Error("unknown contract accepted")
	}
	if _, err := NewTool(tools.Spec{Contract: tools.Idempotent}, json.RawMessage(`{"type":"object"}`)); err == nil {
		t.Error("empty name accepted")
	}
}

// benchSchemas are typical tool schemas with typical arguments (copies of
// catalog_search's and send_email's: this package cannot import theirs).
var benchSchemas = []struct{ name, schema, args string }{
	{"catalog", `{
  "type": "object",
  "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 200, "description": "Words to look for in product names, descriptions and tags."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Most matches to return (default 5)."}
  },
  "required": ["query"],
  "additionalProperties": false
}`, `{"query":"wireless headphones","limit":5}`},
	{"email", `{
  "type": "object",
  "properties": {
    "to": {"type": "string", "format": "email", "maxLength": 254},
    "subject": {"type": "string", "minLength": 1, "maxLength": 200},
    "body": {"type": "string", "minLength": 1, "maxLength": 10000}
  },
  "required": ["to", "subject", "body"],
  "additionalProperties": false
}`, `{"to":"ann@example.com","subject":"Quote 483","body":"` + strings.Repeat("Hello Ann, here is the quote. ", 30) + `"}`},
	{"nested", testSchema, `{"to":"ann@example.com","name":"Zoë","n":5.0,"x":1.5,"ok":true,"tags":["a","<b>"],"color":"red","addr":{"city":"Köln"}}`},
}

func BenchmarkSchemaValidate(b *testing.B) {
	for _, bs := range benchSchemas {
		s := MustCompile(bs.schema)
		args := json.RawMessage(bs.args)
		b.Run(bs.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Validate(args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSchemaCompile(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		MustCompile(testSchema)
	}
}
