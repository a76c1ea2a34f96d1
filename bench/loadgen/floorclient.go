package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// floorEnv is what the floor's clients of one scenario share.
type floorEnv struct {
	base      string
	errs      *errorLog
	dialSem   chan struct{}
	measuring atomic.Bool
	start     time.Time
}

func newFloorEnv(base string) *floorEnv {
	return &floorEnv{base: base, errs: newErrorLog(), dialSem: make(chan struct{}, 32), start: time.Now()}
}

// fail records an error of kind unless ctx ended: an error after the
// end is the end's doing, not the floor's.
func (e *floorEnv) fail(ctx context.Context, kind, example string) {
	if ctx.Err() == nil {
		e.errs.add(kind, example)
	}
}

func (e *floorEnv) dial(ctx context.Context) (*websocket.Conn, error) {
	select {
	case e.dialSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-e.dialSem }()
	dialCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(dialCtx, "ws"+strings.TrimPrefix(e.base, "http")+"/", &websocket.DialOptions{
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	conn.SetReadLimit(16 << 20)
	return conn, nil
}

// floorTopic is the floor's counterpart of a thread: one publisher and its
// subscribers.
type floorTopic struct {
	env   *floorEnv
	name  string
	subs  []*floorSub
	final atomic.Int64 // the last seq published

	spreadMu sync.Mutex
	ring     [spreadRing]struct{ seq, at int64 }

	published atomic.Int64 // while measuring
}

// floorSub is one subscriber connection; its goroutine (run) reads until
// the scenario ends.
type floorSub struct {
	topic *floorTopic
	name  string

	ready      chan struct{}
	readyOnce  sync.Once
	lastSeqA   atomic.Int64
	deliveries atomic.Int64

	lastSeq       int64 // owned by run
	lat, spreadUs samples
}

func newFloorTopics(e *floorEnv, topics, subsPer int) []*floorTopic {
	out := make([]*floorTopic, topics)
	for i := range out {
		t := &floorTopic{env: e, name: "t" + strconv.Itoa(i)}
		for k := range subsPer {
			t.subs = append(
				t.subs,
				&floorSub{topic: t, name: fmt.Sprintf("%s.%d", t.name, k), ready: make(chan struct{})},
			)
		}
		out[i] = t
	}
	return out
}

func (s *floorSub) run(ctx context.Context) {
	e := s.topic.env
	conn, err := e.dial(ctx)
	if err != nil {
		e.fail(ctx, "dial", err.Error())
		return
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, []byte("sub "+s.topic.name)); err != nil {
		e.fail(ctx, "write", err.Error())
		return
	}
	defer closeOnDone(ctx, conn)()
	var buf bytes.Buffer
	for range maxFrames {
		_, rd, err := conn.Reader(context.Background())
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(rd)
		}
		if err != nil {
			e.fail(ctx, "close_"+strconv.Itoa(int(websocket.CloseStatus(err))), fmt.Sprintf("%s: %v", s.name, err))
			return
		}
		now := time.Now()
		splitFrame(buf.Bytes(), func(obj []byte) { s.handle(obj, now) })
	}
}

func (s *floorSub) handle(obj []byte, now time.Time) {
	e := s.topic.env
	if bytes.HasPrefix(obj, []byte(floorSubscribedPfx)) {
		s.readyOnce.Do(func() { close(s.ready) })
		return
	}
	var m wireMsg
	if err := decodeMsg(obj, &m); err != nil {
		e.errs.add("bad_json", fmt.Sprintf("%v: %.200s", err, obj))
		return
	}
	switch {
	case m.Seq == s.lastSeq+1:
	case m.Seq <= s.lastSeq:
		e.errs.add("seq_duplicate", fmt.Sprintf("%s: seq %d after %d", s.name, m.Seq, s.lastSeq))
		return
	default:
		e.errs.add("seq_gap", fmt.Sprintf("%s: seq %d after %d", s.name, m.Seq, s.lastSeq))
	}
	s.lastSeq = m.Seq
	s.lastSeqA.Store(m.Seq)
	s.deliveries.Add(1)
	if e.measuring.Load() {
		s.lat.add(now.UnixMicro() - m.TS*1000)
		s.spreadUs.add(spreadOf(&s.topic.spreadMu, &s.topic.ring, m.Seq, now.Sub(e.start).Microseconds()))
	}
}

// floorPayload builds the message a floor publisher sends: the shape of a
// gateway message.delta event, its text padded so the whole object is size
// bytes (when size is larger than the shape itself).
func floorPayload(topic string, seq, ts int64, size int) []byte {
	head := fmt.Sprintf(
		`{"type":"message.delta","thread_id":%q,"seq":%d,"ts":%d,`+
			`"run_id":"run_floor0000000000000000","message_id":"msg_floor0000000000000000","text":"`,
		topic, seq, ts,
	)
	const tail = `"}`
	pad := max(size-len(head)-len(tail), 1)
	b := make([]byte, 0, len(head)+pad+len(tail))
	b = append(b, head...)
	for i := range pad {
		if i%6 == 0 {
			b = append(b, ' ')
		} else {
			b = append(b, 'w')
		}
	}
	return append(b, tail...)
}

// publish sends one payload per interval until stopAt (bounded by
// maxMessages), numbering them from 1, after waiting offset (publishers
// are staggered over one interval, as the gateway's runs are, so the
// topics do not all publish in the same instant).
func (t *floorTopic) publish(
	ctx context.Context,
	offset, interval time.Duration,
	size int,
	stopAt time.Time,
	maxMessages int64,
) {
	e := t.env
	conn, err := e.dial(ctx)
	if err != nil {
		e.fail(ctx, "dial", err.Error())
		return
	}
	defer conn.CloseNow()
	readCtx := conn.CloseRead(ctx)
	sleep(ctx, offset)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	prefix := []byte("pub " + t.name + " ")
	for seq := int64(1); seq <= maxMessages && time.Now().Before(stopAt); seq++ {
		select {
		case <-readCtx.Done():
			e.fail(ctx, "publisher_closed", t.name)
			return
		case <-tick.C:
		}
		frame := append(append([]byte{}, prefix...), floorPayload(t.name, seq, time.Now().UnixMilli(), size)...)
		if err := conn.Write(ctx, websocket.MessageText, frame); err != nil {
			e.fail(ctx, "publish", err.Error())
			return
		}
		t.final.Store(seq)
		if e.measuring.Load() {
			t.published.Add(1)
		}
	}
}
