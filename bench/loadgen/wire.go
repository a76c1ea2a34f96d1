package loadgen

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/coder/websocket"
)

// The floor's wire (floorclient.go). The gateway is driven through package
// client; the floor (bench/floor) is not the gateway, so its subscribers
// read their frames themselves: "ok <topic>" once subscribed, then events
// of the gateway's message.delta shape.

// splitFrame calls fn with each object of a floor frame: the floor sends
// one or more JSON objects per text frame, separated by "\n", as the
// gateway does (JSON text never holds a raw newline, so the split is
// exact). Empty pieces are skipped. It returns how many objects it passed
// to fn.
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

// wireMsg holds the fields of a floor event the subscribers look at.
type wireMsg struct {
	Type     string `json:"type"`
	ThreadID string `json:"thread_id"`
	Seq      int64  `json:"seq"`
	TS       int64  `json:"ts"`
}

func decodeMsg(obj []byte, m *wireMsg) error {
	*m = wireMsg{}
	return json.Unmarshal(obj, m)
}

// floorSubscribedPfx starts the floor's answer to "sub <topic>".
const floorSubscribedPfx = "ok "

// maxFrames bounds the frames one floor connection reads.
const maxFrames = 50_000_000

// closeOnDone closes conn when ctx ends; the returned function stops that
// and waits for a close already under way. (Reads take no context: one
// registration per read costs the generator CPU it shares with the
// server.)
func closeOnDone(ctx context.Context, conn *websocket.Conn) (stop func()) {
	closed := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(closed)
		conn.CloseNow()
	})
	return func() {
		if !stopAfter() {
			<-closed
		}
	}
}
