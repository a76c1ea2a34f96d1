package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// ---- 6: history holds only published messages ----

func checkHistoryIsPublished(a *auditor, th *auditThread) {
	for _, cp := range th.cps {
		for _, id := range cp.MessageIDs {
			if _, ok := th.msgByID[id]; ok {
				continue
			}
			// A fork's history starts with its source's messages.
			owner, err := a.rowThread(a.msgThread, `SELECT thread_id FROM messages WHERE message_id = ?`, id)
			a.lookupErr(err)
			ok := false
			for src, depth := th.row.ThreadID, 0; owner != "" && src != "" && depth < 1000 && !ok; depth++ {
				src, err = a.forkSource(src)
				a.lookupErr(err)
				ok = src == owner
			}
			if !ok {
				a.add(
					6,
					"checkpoint %s holds %s, which is not a published message of its thread or fork source",
					cp.CheckpointID, id,
				)
			}
		}
	}
	// Text built from the stream buffer is exactly its deltas (docs/protocol.md):
	// a run's published message all of them, a saved fragment those up to
	// its last_seq. A written delta leaves the buffer only by retention, so
	// text is excused from the comparison only where its missing deltas
	// can lie at or below the stream purge mark; one gone above it is a
	// violation, also where stream_gaps records its seq as lost (a crash or
	// a write-past loses only deltas never written, never counted).
	texts := th.bufferedTexts()
	for _, m := range th.msgs {
		switch {
		case m.Kind == chat.KindFragment && m.FragmentOf.Valid && !m.RedactedAt.Valid:
			var of chat.FragmentOf
			if err := json.Unmarshal([]byte(m.FragmentOf.String), &of); err != nil {
				a.add(0, "fragment %s has unreadable fragment_of: %v", m.MessageID, err)
				continue
			}
			b := texts[of.MessageID]
			switch {
			case b == nil || !b.counted:
				// A fragment is saved only from a message the thread streamed
				// (stream_messages), and that row is never deleted.
				a.add(
					6,
					"saved fragment %s (thread %s) is the text of message %s, which thread %s never streamed",
					m.MessageID, m.ThreadID, of.MessageID, m.ThreadID,
				)
			case b.misnumbered != "":
				a.add(
					6,
					"saved fragment %s (thread %s) cannot be the text of message %s: %s",
					m.MessageID, m.ThreadID, of.MessageID, b.misnumbered,
				)
			case len(b.gone) > 0 && b.goneFrom <= of.LastSeq:
				a.add(
					6,
					"saved fragment %s (thread %s) is the text of message %s up to seq %d, "+
						"but %s of it (seq %d or later) is gone and no retention purge explains it",
					m.MessageID, m.ThreadID, of.MessageID, of.LastSeq, partList(b.gone), b.goneFrom,
				)
			case b.purged:
				// Its first deltas went with the stream TTL: no longer comparable.
			case b.text(of.LastSeq) != m.Content:
				a.add(
					6,
					"saved fragment %s is not exactly the text of message %s up to seq %d",
					m.MessageID, of.MessageID, of.LastSeq,
				)
			}
		case m.RunID.Valid && m.Kind != chat.KindFragment && !m.RedactedAt.Valid:
			b := texts[m.MessageID]
			if b == nil {
				continue // not streamed (a tool result)
			}
			b.published = true
			switch {
			case b.misnumbered != "":
				a.add(
					6,
					"message %s (thread %s, run %s) is published, but its deltas are not what was written of it: %s",
					m.MessageID, m.ThreadID, m.RunID.String, b.misnumbered,
				)
			case len(b.gone) > 0:
				a.add(
					6,
					"message %s (thread %s, run %s) is published, but %s of its %d written deltas (seq %d or later) "+
						"is gone and no retention purge explains it (stream purge mark %d): "+
						"its content is not the concatenation of its deltas",
					m.MessageID, m.ThreadID, m.RunID.String, partList(b.gone), b.written.Parts, b.goneFrom,
					th.row.DeltasPurgedThrough,
				)
			case b.purged:
				// Its first deltas went with the stream TTL: the rest is the
				// end of its text.
				if !strings.HasSuffix(m.Content, b.text(-1)) {
					a.add(
						6,
						"message %s does not end with the text of its deltas still buffered "+
							"(the first ones were purged)",
						m.MessageID,
					)
				}
			case b.text(-1) != m.Content:
				a.add(6, "message %s differs from the text of its deltas", m.MessageID)
			}
		}
	}
	// A written delta of a message nobody published is gone without a
	// purge: the log lost it, whatever stream_gaps records (invariant 8).
	for _, id := range slices.Sorted(maps.Keys(texts)) {
		switch b := texts[id]; {
		case b.published:
		case b.misnumbered != "":
			a.add(
				8,
				"thread %s: the deltas of message %s are not what was written of it: %s",
				th.row.ThreadID, id, b.misnumbered,
			)
		case len(b.gone) > 0:
			a.add(
				8,
				"thread %s: %s of the %d written deltas of message %s (seq %d or later) "+
					"is gone and no retention purge explains it",
				th.row.ThreadID, partList(b.gone), b.written.Parts, id, b.goneFrom,
			)
		}
	}
}

// bufferedText is what the stream buffer holds of one message, against
// what was written of it (its stream_messages row).
type bufferedText struct {
	written streamCount
	counted bool         // the message has a stream_messages row
	held    []auditDelta // by seq
	// purged: a written delta is missing where retention may have removed
	// it (the earliest seq it can have had is at or below the stream purge
	// mark): the text can no longer be compared whole.
	purged bool
	// gone: the written parts missing where no purge can explain them
	// (the earliest seq each can have had is above the mark), and the
	// earliest seq the first of them can have had.
	gone     []int
	goneFrom int64
	// misnumbered says how held deltas are not the written parts in seq
	// order ("" when they are).
	misnumbered string
	published   bool // a run's published message (set by its check)
}

// bufferedTexts sorts the thread's held deltas by message and finds, for
// each streamed message, which of its written deltas are missing and
// whether retention can have removed them: the parts are numbered in seq
// order from first_seq, so part j lies at least j seqs after first_seq,
// and after any held part before it.
func (th *auditThread) bufferedTexts() map[string]*bufferedText {
	out := map[string]*bufferedText{}
	get := func(id string) *bufferedText {
		b := out[id]
		if b == nil {
			b = &bufferedText{}
			out[id] = b
		}
		return b
	}
	for _, d := range th.deltas {
		b := get(d.MessageID)
		b.held = append(b.held, d)
	}
	for id, w := range th.written {
		b := get(id)
		b.written, b.counted = w, true
	}
	mark := th.row.DeltasPurgedThrough
	for id, b := range out {
		next, prevPart, prevSeq := 0, -1, b.written.FirstSeq-1
		missing := func(upTo int) { // parts next..upTo-1 are not held
			for j := next; j < upTo; j++ {
				at := prevSeq + int64(j-prevPart) // the earliest seq part j can have had
				if at <= mark {
					b.purged = true
					continue
				}
				if len(b.gone) == 0 {
					b.goneFrom = at
				}
				b.gone = append(b.gone, j)
			}
		}
		for _, d := range b.held {
			switch {
			case !b.counted:
				b.misnumbered = fmt.Sprintf(
					"message %s has deltas (seq %d on) but no stream_messages row counting them",
					id, d.Seq,
				)
			case d.Part < next || d.Part >= b.written.Parts:
				b.misnumbered = fmt.Sprintf(
					"delta seq %d of message %s is part %d, not the next of the %d parts written in seq order",
					d.Seq, id, d.Part, b.written.Parts,
				)
			}
			if b.misnumbered != "" {
				break
			}
			missing(d.Part)
			next, prevPart, prevSeq = d.Part+1, d.Part, d.Seq
		}
		if b.misnumbered == "" {
			missing(b.written.Parts)
		}
	}
	return out
}

// text is the concatenated text of the held deltas with seq up to upTo
// (all of them for -1).
func (b *bufferedText) text(upTo int64) string {
	var s strings.Builder
	for _, d := range b.held {
		if upTo < 0 || d.Seq <= upTo {
			s.WriteString(d.Text)
		}
	}
	return s.String()
}

// partList names written parts for a report: "part 3", "parts 3–5".
func partList(parts []int) string {
	if len(parts) == 1 {
		return fmt.Sprintf("part %d", parts[0])
	}
	if parts[len(parts)-1]-parts[0] == len(parts)-1 {
		return fmt.Sprintf("parts %d–%d", parts[0], parts[len(parts)-1])
	}
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprint(p)
	}
	return "parts " + strings.Join(s, ", ")
}

// ---- 8: the log is gapless but for recorded absences; one event each ----

func checkEventLog(a *auditor, th *auditThread) {
	t := th.row
	// Durable events and deltas share one sequence: merged, every seq from
	// 1 to last_seq appears once, except an event at or below the event
	// purge mark or a delta at or below the stream purge mark. (A seq
	// missing at or below the stream mark is taken for a purged delta; were
	// it a durable event, invariant 5 sees the version it took.)
	held := make([]int64, 0, len(th.events)+len(th.deltas))
	for i, j := 0, 0; i < len(th.events) || j < len(th.deltas); {
		if j >= len(th.deltas) || (i < len(th.events) && th.events[i].Seq <= th.deltas[j].Seq) {
			held = append(held, th.events[i].Seq)
			i++
		} else {
			held = append(held, th.deltas[j].Seq)
			j++
		}
	}
	mark := max(t.EventsPurgedThrough, t.DeltasPurgedThrough)
	var missing []string
	report := func(from, to int64) {
		switch {
		case from > to:
		case from == to:
			missing = append(missing, fmt.Sprint(from))
		default:
			missing = append(missing, fmt.Sprintf("%d–%d", from, to))
		}
	}
	// Seqs recorded lost in a crash may be absent; one of them held, or a
	// record past last_seq, contradicts the record.
	for i, l := range th.lost {
		if l.FirstSeq < 1 || l.LastSeq < l.FirstSeq || l.LastSeq > t.LastSeq ||
			(i > 0 && l.FirstSeq <= th.lost[i-1].LastSeq) {
			a.add(
				8,
				"thread %s records seqs %d–%d lost, outside 1..last_seq (%d) or overlapping another record",
				t.ThreadID, l.FirstSeq, l.LastSeq, t.LastSeq,
			)
		}
	}
	for _, seq := range held {
		for _, l := range th.lost {
			if seq >= l.FirstSeq && seq <= l.LastSeq {
				a.add(
					8,
					"thread %s holds seq %d, which it records lost (%d–%d)",
					t.ThreadID, seq, l.FirstSeq, l.LastSeq,
				)
			}
		}
	}
	gap := func(from, to int64) { // seqs from..to are absent
		from = max(from, mark+1)
		to = min(to, t.LastSeq)
		for _, l := range th.lost {
			if from > to {
				return
			}
			if l.LastSeq < from || l.FirstSeq > to {
				continue
			}
			report(from, l.FirstSeq-1)
			from = l.LastSeq + 1
		}
		report(from, to)
	}
	prev := int64(0)
	for _, seq := range held {
		switch {
		case seq == prev:
			a.add(8, "thread %s has seq %d twice", t.ThreadID, seq)
		case seq < 1 || seq > t.LastSeq:
			a.add(8, "thread %s holds seq %d, outside 1..last_seq (%d)", t.ThreadID, seq, t.LastSeq)
		}
		gap(prev+1, seq-1)
		prev = max(prev, seq)
	}
	gap(prev+1, t.LastSeq)
	for _, r := range missing {
		a.add(8, "thread %s is missing seq %s from its log, and no purge explains it", t.ThreadID, r)
	}

	// Every published message has exactly one message.published and every
	// checkpoint exactly one checkpoint.created, each naming it; every such
	// event has its row.
	published := map[string]int{}
	created := map[string]int{}
	// logHead is the head the log's events put the thread at: every
	// checkpoint.created makes its checkpoint the head, a
	// thread.head_moved its own ("": no such event held).
	logHead := ""
	for _, e := range th.events {
		if e.bodyErr != nil {
			a.add(8, "thread %s event seq %d has an unreadable payload: %v", t.ThreadID, e.Seq, e.bodyErr)
			continue
		}
		b := e.body
		if b.Type != e.Type || b.Seq != e.Seq || b.StateVersion != e.StateVersion || b.RunID != e.RunID.String {
			a.add(
				8,
				"thread %s event seq %d (%s) carries other fields than its log row (type %s, seq %d, v%d, run %q)",
				t.ThreadID, e.Seq, e.Type, b.Type, b.Seq, b.StateVersion, b.RunID,
			)
		}
		switch e.Type {
		case chat.EventMessagePublished:
			id := e.MessageID.String
			published[id]++
			m, ok := th.msgByID[id]
			switch {
			case b.Message == nil || b.Message.MessageID != id:
				a.add(8, "message.published seq %d of thread %s does not carry message %s", e.Seq, t.ThreadID, id)
			case !ok:
				a.add(
					8,
					"message.published seq %d of thread %s names message %s, which does not exist",
					e.Seq, t.ThreadID, id,
				)
			case b.Message.Content != m.Content:
				a.add(
					8,
					"message.published seq %d of thread %s carries another text than message %s",
					e.Seq, t.ThreadID, id,
				)
			}
		case chat.EventCheckpointCreated:
			created[b.CheckpointID]++
			cp, ok := th.cpByID[b.CheckpointID]
			switch {
			case !ok:
				a.add(
					8,
					"checkpoint.created seq %d of thread %s names checkpoint %q, which does not exist",
					e.Seq, t.ThreadID, b.CheckpointID,
				)
			case (cp.ParentCheckpointID == nil) != (b.ParentID == nil) ||
				(b.ParentID != nil && *b.ParentID != *cp.ParentCheckpointID):
				a.add(
					8,
					"checkpoint.created seq %d of thread %s names another parent than checkpoint %s has",
					e.Seq, t.ThreadID, cp.CheckpointID,
				)
			}
			logHead = b.CheckpointID
		case chat.EventThreadHeadMoved:
			if _, ok := th.cpByID[b.HeadID]; !ok {
				a.add(
					8,
					"thread.head_moved seq %d of thread %s moves the head to %q, which is not one of its checkpoints",
					e.Seq, t.ThreadID, b.HeadID,
				)
			}
			if logHead != "" && b.PreviousHead != logHead {
				a.add(
					8,
					"thread.head_moved seq %d of thread %s says the head was %q, but the log put it at %s",
					e.Seq, t.ThreadID, b.PreviousHead, logHead,
				)
			}
			logHead = b.HeadID
		case chat.EventMessageDeleted:
			if _, ok := th.msgByID[b.MessageID]; !ok {
				a.add(
					8,
					"message.deleted seq %d of thread %s names message %q, which is not the thread's",
					e.Seq, t.ThreadID, b.MessageID,
				)
			}
		case chat.EventToolPrepared, chat.EventToolUpdated:
			if b.Operation == nil {
				a.add(8, "%s seq %d of thread %s carries no operation", e.Type, e.Seq, t.ThreadID)
			} else if op, ok := th.opByID[b.Operation.OperationID]; !ok || op.RunID != e.RunID.String {
				a.add(8, "%s seq %d of thread %s names operation %q, "+
					"which is not one of run %s", e.Type, e.Seq, t.ThreadID, b.Operation.OperationID, e.RunID.String)
			}
		}
		if strings.HasPrefix(e.Type, "run.") || strings.HasPrefix(e.Type, "tool.") {
			if _, ok := th.runByID[e.RunID.String]; !ok {
				a.add(
					8,
					"%s seq %d of thread %s names run %q, which is not one of the thread's",
					e.Type, e.Seq, t.ThreadID, e.RunID.String,
				)
			}
		}
	}
	if logHead != "" && logHead != t.HeadCheckpointID {
		a.add(
			8,
			"thread %s has head %s, but its last checkpoint.created or thread.head_moved put it at %s",
			t.ThreadID, t.HeadCheckpointID, logHead,
		)
	}
	for _, m := range th.msgs {
		if n := published[m.MessageID]; n != 1 && !(n == 0 && th.versionPurged(m.StateVersion)) {
			a.add(8, "message %s has %d message.published events", m.MessageID, n)
		}
		if m.RedactedAt.Valid &&
			(m.Content != "" || (!t.DeletedAt.Valid && (!m.DeletedAt.Valid || m.Kind != chat.KindFragment))) {
			a.add(
				0,
				"message %s is marked redacted but is not an emptied deleted draft or message of a deleted thread",
				m.MessageID,
			)
		}
	}
	for _, cp := range th.cps {
		if n := created[cp.CheckpointID]; n != 1 && !(n == 0 && th.versionPurged(cp.StateVersion)) {
			a.add(8, "checkpoint %s has %d checkpoint.created events", cp.CheckpointID, n)
		}
	}
}
