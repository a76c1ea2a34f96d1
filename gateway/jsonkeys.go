package gateway

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// duplicateKey refuses a JSON text in which one object names a key twice,
// at any depth. encoding/json keeps the last of them silently, while other
// parsers (a proxy, a log pipeline, a client library) may keep the first:
// the same bytes would then mean two different commands. Keys are compared
// after unescaping ("a" and "\u0061" are one key), as a decoder sees them.
//
// It walks the tokens once (linear in the body's size) and keeps one set
// of keys per object being read, so at most one per level of nesting. It
// is run on bodies the strict decode already accepted (which bounds their
// nesting); on a text that does not parse it returns nil and leaves the
// error to the decode.
func duplicateKey(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // numbers are skipped: never convert them
	// One frame per open object or array; in an object, wantKey says
	// whether the next string token is a key (rather than a value).
	// name is the key (in an object) or "[]" (in an array) the container
	// was opened under, for the error message.
	type frame struct {
		object, wantKey bool
		keys            map[string]struct{}
		name            string
	}
	var stack []frame
	// value notes that a value was read in the innermost container: in an
	// object the next string is a key again.
	value := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	lastKey := ""
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // io.EOF, or a syntax error the decode reports
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				name := ""
				if n := len(stack); n > 0 {
					name = "[]"
					if stack[n-1].object {
						name = lastKey
					}
				}
				value()
				stack = append(stack, frame{object: v == '{', wantKey: v == '{', name: name})
			default: // '}' or ']'
				stack = stack[:len(stack)-1]
			}
		case string:
			n := len(stack)
			if n == 0 || !stack[n-1].object || !stack[n-1].wantKey {
				value()
				continue
			}
			top := &stack[n-1]
			top.wantKey = false
			if top.keys == nil {
				top.keys = map[string]struct{}{}
			}
			if _, dup := top.keys[v]; dup {
				where := "the request"
				if n > 1 {
					var path strings.Builder
					for _, f := range stack[1:] {
						if f.name != "[]" && path.Len() > 0 {
							path.WriteByte('.')
						}
						path.WriteString(f.name)
					}
					where = "the object " + quoteShort(path.String())
				}
				return chat.Invalid("key %s appears twice in %s: send each field once", quoteShort(v), where)
			}
			top.keys[v] = struct{}{}
			lastKey = v
		default:
			value()
		}
	}
}
