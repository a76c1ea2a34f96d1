package loadgen

import (
	"bytes"
	"encoding/json"
)

// splitFrame calls fn with each object of a server frame: the gateway (and
// the floor) send one or more JSON objects per text frame, separated by
// "\n" (JSON text never holds a raw newline, so the split is exact). Empty
// pieces are skipped. It returns how many objects it passed to fn.
func splitFrame(frame []byte, fn func(obj []byte)) int {
	n := 0
	for len(frame) > 0 {
		var obj []byte
		if i := bytes.IndexByte(frame, '\n'); i >= 0 {
			obj, frame = frame[:i], frame[i+1:]
		} else {
			obj, frame = frame, nil
		}
		obj = bytes.TrimSpace(obj)
		if len(obj) == 0 {
			continue
		}
		fn(obj)
		n++
	}
	return n
}

// wireMsg holds the top-level fields of any server object the generator
// looks at: acks, errors, events (PROTOCOL.md). Nested objects (a snapshot's
// messages, an event's message) are skipped.
type wireMsg struct {
	Type         string `json:"type"`
	Re           string `json:"re"`
	ThreadID     string `json:"thread_id"`
	Seq          int64  `json:"seq"`
	TS           int64  `json:"ts"`
	StateVersion int64  `json:"state_version"`
	RunID        string `json:"run_id"`

	// acks and errors
	Error            string          `json:"error"`
	Message          json.RawMessage `json:"message"` // a string on errors, an object on message.published
	Status           string          `json:"status"`
	LastSeq          int64           `json:"last_seq"`
	Recovered        bool            `json:"recovered"`
	AlreadyRequested bool            `json:"already_requested"`
}

// text is an error's message.
func (m *wireMsg) text() string {
	var s string
	if json.Unmarshal(m.Message, &s) != nil {
		return string(m.Message)
	}
	return s
}

func decodeMsg(obj []byte, m *wireMsg) error {
	*m = wireMsg{}
	return json.Unmarshal(obj, m)
}

// Event and command types the generator uses.
const (
	typeAck            = "ack"
	typeError          = "error"
	typeDelta          = "message.delta"
	typeSnapshot       = "thread.snapshot"
	typePublished      = "message.published"
	typeRunCompleted   = "run.completed"
	typeRunFailed      = "run.failed"
	typeRunCancelled   = "run.cancelled"
	typeToolUpdated    = "tool.updated"
	codeRunNotActive   = "run_not_active"
	codeRateLimited    = "rate_limited"
	floorSubscribedPfx = "ok "
)
