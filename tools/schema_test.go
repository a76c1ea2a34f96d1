package tools

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
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

func TestSchemaValidate(t *testing.T) {
	s := MustCompileSchema(testSchema)
	good := []struct{ in, want string }{
		{`{"to":"ann@example.com"}`, `{"to":"ann@example.com"}`},
		{` { "n" : 5.0, "to":"ann@example.com" , "ok": false } `, `{"n":5,"ok":false,"to":"ann@example.com"}`},
		{`{"to":"a.b+c@mail.example.org","n":2e1,"x":1.50}`, `{"n":20,"to":"a.b+c@mail.example.org","x":1.5}`},
		{`{"to":"ann@example.com","name":"Zoë","tags":["a","<b>"],"color":"red","addr":{"city":"Köln"}}`,
			`{"addr":{"city":"Köln"},"color":"red","name":"Zoë","tags":["a","<b>"],"to":"ann@example.com"}`},
		{`{"to":"ann@example.com","tags":[]}`, `{"tags":[],"to":"ann@example.com"}`},
	}
	for _, c := range good {
		got, err := s.Validate(json.RawMessage(c.in))
		if err != nil {
			t.Errorf("Validate(%s): %v", c.in, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("Validate(%s) = %s, want %s", c.in, got, c.want)
		}
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
		var ia *InvalidArgs
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
	s := MustCompileSchema(`{"type":"object","properties":{"a":{"type":"integer"}}}`)
	got, err := s.Validate(json.RawMessage(`{"z":{"y":1,"x":[1.0]},"a":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":3,"z":{"x":[1.0],"y":1}}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestCompileSchemaErrors(t *testing.T) {
	bad := []string{
		`nope`,
		`{"type":"string"}`,
		`{"properties":{}}`,
		`{"type":"object","properties":{"a":{"type":"date"}}}`,
		`{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}`,
		`{"type":"object","properties":{"a":{"type":"string","format":"uri"}}}`,
		`{"type":"object","properties":{"a":{"type":"string","maxLength":-1}}}`,
		`{"type":"object","properties":{"a":{"type":"integer","maxLength":3}}}`,
		`{"type":"object","required":["a"]}`,
		`{"type":"object","additionalProperties":{"type":"string"}}`,
		`{"type":"object","enum":[{}]}`,
		`{"type":"object","properties":{"a":{"type":"integer","enum":["x"]}}}`,
		`{"type":"object","properties":{"a":{"type":["string","null"]}}}`,
	}
	for _, src := range bad {
		if _, err := CompileSchema(json.RawMessage(src)); err == nil {
			t.Errorf("CompileSchema(%s) succeeded", src)
		}
	}
}

func TestNewSchemaTool(t *testing.T) {
	tool, err := NewSchemaTool(Spec{Name: "hook", Description: "d", Contract: Cancellable},
		json.RawMessage(`{ "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"] }`))
	if err != nil {
		t.Fatal(err)
	}
	var _ Tool = tool
	if got := string(tool.Spec().Parameters); got != `{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}` {
		t.Errorf("Parameters = %s", got)
	}
	if _, err := tool.Validate(json.RawMessage(`{}`)); err == nil {
		t.Error("missing q accepted")
	}
	if _, err := NewSchemaTool(Spec{Name: "x", Contract: "maybe"}, json.RawMessage(`{"type":"object"}`)); err == nil {
		t.Error("unknown contract accepted")
	}
	if _, err := NewSchemaTool(Spec{Contract: Idempotent}, json.RawMessage(`{"type":"object"}`)); err == nil {
		t.Error("empty name accepted")
	}
}
