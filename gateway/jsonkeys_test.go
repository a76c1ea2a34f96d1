package gateway

import (
	"strconv"
	"strings"
	"testing"
)

func TestDuplicateKey(t *testing.T) {
	for _, ok := range []string{
		`{}`,
		`{"a":1,"b":2}`,
		`{"a":{"a":1},"b":[{"a":1},{"a":2}]}`,
		`{"a":"b","b":"a"}`,
		`{"a":["a","a"],"b":{"a":"a"}}`,
		`{"A":1,"a":2}`, // exactFields refuses the case-folded one
		`[1,2,{"x":1}]`,
		`{"a":`, // malformed: left to the decoder
	} {
		if err := duplicateKey([]byte(ok)); err != nil {
			t.Errorf("duplicateKey(%s) = %v, want nil", ok, err)
		}
	}
	for body, want := range map[string]string{
		`{"a":1,"a":2}`:                 `key "a" appears twice in the request`,
		`{"a":1,"\u0061":2}`:            `key "a" appears twice in the request`,
		`{"x":{"a":1,"b":{},"a":2}}`:    `key "a" appears twice in the object "x"`,
		`{"x":[{"y":{"k":1,"k":1}}]}`:   `key "k" appears twice in the object "x[].y"`,
		`{"a":[1,{"b":2}],"c":3,"a":4}`: `key "a" appears twice in the request`,
	} {
		err := duplicateKey([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("duplicateKey(%s) = %v, want %q", body, err, want)
		}
	}
	// Linear: a body of 1 MiB of distinct keys is read in one pass.
	var b strings.Builder
	b.WriteString(`{`)
	for i := 0; b.Len() < maxBody-32; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k`)
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(strconv.Itoa(i))
		b.WriteString(`":0`)
	}
	b.WriteString(`}`)
	if err := duplicateKey([]byte(b.String())); err != nil {
		t.Fatalf("distinct keys: %v", err)
	}
}
