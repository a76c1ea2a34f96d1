package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// MaxTitleLength is the longest thread title accepted, in bytes.
const MaxTitleLength = chat.MaxTitleBytes

// CreateThread creates a thread with its first checkpoint (empty history,
// state_version 1) and returns its snapshot.
func (s *Store) CreateThread(ctx context.Context, userID, title string) (chat.Snapshot, error) {
	threadID := chat.NewID(chat.PrefixThread)
	err := s.write(ctx, func(t *txn) error {
		return t.createThread(userID, threadID, title, nil, chat.Checkpoint{})
	})
	if err != nil {
		return chat.Snapshot{}, err
	}
	return s.Snapshot(ctx, userID, threadID)
}

// createThread inserts a thread and its root checkpoint, which copies the
// state of root (empty for a new thread, the source's for a fork).
func (t *txn) createThread(userID, threadID, title string, from *chat.ForkSource, root chat.Checkpoint) error {
	now := ms(t.now)
	var fromThread, fromCP any
	if from != nil {
		fromThread, fromCP = from.ThreadID, from.CheckpointID
	}
	if _, err := t.exec(`INSERT INTO threads (thread_id, user_id, title, state_version, last_seq, head_checkpoint_id,
		forked_from_thread_id, forked_from_checkpoint_id, created_at, updated_at)
		VALUES (?, ?, ?, 0, 0, '', ?, ?, ?, ?)`,
		threadID, userID, title, fromThread, fromCP, now, now); err != nil {
		return fmt.Errorf("insert thread: %w", err)
	}
	c, err := t.thread(userID, threadID)
	if err != nil {
		return err
	}
	root.CheckpointID = chat.NewID(chat.PrefixCheckpoint)
	root.ParentCheckpointID = nil
	_, err = t.addCheckpoint(c, root, "")
	return err
}

// addCheckpoint writes cp (its id set by the caller, its thread and version
// filled here, its lists whole) as the thread's new head and appends
// checkpoint.created. It stores the lists as what they append to the
// parent's where they continue them (checkpoints.go).
func (t *txn) addCheckpoint(c *threadCursor, cp chat.Checkpoint, runID string) (chat.Checkpoint, error) {
	ev := t.event(c, chat.EventCheckpointCreated, runID)
	cp.ThreadID = c.row.ThreadID
	cp.StateVersion = ev.StateVersion
	cp.CreatedAt = fromMS(ms(t.now))
	if cp.MessageIDs == nil {
		cp.MessageIDs = []string{}
	}
	if cp.CompletedSteps == nil {
		cp.CompletedSteps = []string{}
	}
	if cp.ToolResults == nil {
		cp.ToolResults = []chat.ToolResult{}
	}
	var pending any
	if cp.Pending != nil {
		pending = mustJSON(cp.Pending)
	}
	cp.RunID = nil
	if runID != "" {
		cp.RunID = &runID
	}
	msgs, steps, tools, appended, node, err := t.storedLists(cp)
	if err != nil {
		return cp, err
	}
	if _, err := t.exec(`INSERT INTO checkpoints (checkpoint_id, thread_id, parent_checkpoint_id, state_version,
		message_ids, completed_steps, tool_results, pending, run_id, created_at, appended)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		cp.CheckpointID, cp.ThreadID, nullStrPtr(cp.ParentCheckpointID), cp.StateVersion, listJSON(msgs),
		listJSON(steps), listJSON(tools), pending, nullStr(runID), ms(t.now), boolInt(appended)); err != nil {
		return cp, fmt.Errorf("insert checkpoint: %w", err)
	}
	// A node of a transaction that rolls back names a checkpoint nobody
	// will ask for (its id was never committed): harmless in the cache.
	t.cps.put(cp.CheckpointID, node)
	ev.Body = chat.CheckpointCreatedBody{CheckpointID: cp.CheckpointID, ParentCheckpointID: cp.ParentCheckpointID}
	t.setHead(c, cp.CheckpointID)
	return cp, t.append(ev)
}

// publishMessage writes m as published (its id, role, kind, content and
// fragment_of set by the caller) pointing at checkpointID, and appends
// message.published.
func (t *txn) publishMessage(c *threadCursor, m chat.Message, checkpointID, runID string) (chat.Message, error) {
	ev := t.event(c, chat.EventMessagePublished, runID)
	ev.MessageID = m.MessageID
	m.ThreadID = c.row.ThreadID
	m.StateVersion = ev.StateVersion
	m.CheckpointID = checkpointID
	m.CreatedAt = fromMS(ms(t.now))
	m.RunID = nil
	if runID != "" {
		m.RunID = &runID
	}
	var fragmentOf any
	if m.FragmentOf != nil {
		fragmentOf = mustJSON(m.FragmentOf)
	}
	if _, err := t.exec(`INSERT INTO messages (message_id, thread_id, role, kind, content, state_version,
		checkpoint_id, run_id, fragment_of, created_at, model, truncated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		m.MessageID, m.ThreadID, m.Role, m.Kind, m.Content, m.StateVersion, checkpointID, nullStr(runID),
		fragmentOf, ms(t.now), m.Model, m.Truncated); err != nil {
		return m, fmt.Errorf("insert message: %w", err)
	}
	ev.Body = chat.MessagePublishedBody{Message: m, CheckpointID: checkpointID}
	return m, t.append(ev)
}

// checkpoint loads a checkpoint of the given thread; one of another thread
// answers checkpoint_not_found.
func (t *txn) checkpoint(threadID, checkpointID string) (chat.Checkpoint, error) {
	return loadCheckpoint(t.ctx, t.tx, t.cps, threadID, checkpointID)
}

// threadAt loads userID's thread threadID and its checkpoint checkpointID
// (a command that names a point of the thread: checkout, fork).
func (t *txn) threadAt(userID, threadID, checkpointID string) (*threadCursor, chat.Checkpoint, error) {
	c, err := t.thread(userID, threadID)
	if err != nil {
		return nil, chat.Checkpoint{}, err
	}
	cp, err := t.checkpoint(threadID, checkpointID)
	if err != nil {
		return nil, chat.Checkpoint{}, err
	}
	return c, cp, nil
}

// checkVersion answers state_version_conflict when expected is not the
// thread's current version. basedOn is the checkpoint the refused command
// was based on ("" = the head the tab saw at expected).
func (t *txn) checkVersion(c *threadCursor, expected int64, basedOn string) error {
	if expected == c.row.StateVersion {
		return nil
	}
	if basedOn == "" {
		var id string
		err := t.get(&id, `SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND state_version <= ?
			ORDER BY state_version DESC LIMIT 1`, c.row.ThreadID, expected)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("find checkpoint at version: %w", err)
		}
		basedOn = id
	}
	actions := []string{"reload"}
	if basedOn != "" {
		actions = append(actions, "fork_from_"+basedOn)
	}
	return chat.Errorf(
		chat.CodeStateVersionConflict,
		"this conversation changed elsewhere (you sent version %d, it is now %d): reload it, "+
			"or fork from the point you saw",
		expected, c.row.StateVersion,
	).
		With("current_state_version", c.row.StateVersion).
		With("current_checkpoint_id", c.row.HeadCheckpointID).
		With("allowed_actions", actions)
}

// ListThreads returns the user's threads, most recently updated first, and a
// cursor for the next page ("" when there is none). A non-empty search
// keeps the threads in which every one of its words (up to
// MaxSearchWords) appears, each in the title or in a message of the
// thread that is not a deleted draft: a substring match, case-insensitive
// (on SQLite for ASCII letters only). It reads every message of the
// user's threads that the title did not settle — a scan, not an index
// (docs/page.md, "Search", says why and what it costs).
func (s *Store) ListThreads(
	ctx context.Context,
	userID string,
	limit int,
	cursor, search string,
) ([]chat.Thread, string, error) {
	q := `SELECT ` + threadCols + ` FROM threads WHERE user_id = ? AND deleted_at IS NULL`
	args := []any{userID}
	like := "LIKE"
	if s.pg {
		like = "ILIKE"
	}
	words := strings.Fields(search)
	for _, w := range words[:min(len(words), MaxSearchWords)] {
		pat := "%" + likeEscaper.Replace(w) + "%"
		q += ` AND (title ` + like + ` ? ESCAPE '\' OR EXISTS (SELECT 1 FROM messages m
			WHERE m.thread_id = threads.thread_id
			AND m.deleted_at IS NULL AND m.content ` + like + ` ? ESCAPE '\'))`
		args = append(args, pat, pat)
	}
	if cursor != "" {
		updated, id, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", chat.Invalid(
				"cursor %q is not one this server gave out: start again without a cursor",
				cursor,
			)
		}
		q += ` AND (updated_at < ? OR (updated_at = ? AND thread_id < ?))`
		args = append(args, updated, updated, id)
	}
	q += ` ORDER BY updated_at DESC, thread_id DESC LIMIT ?`
	args = append(args, limit+1)
	var rows []threadRow
	if err := s.reader.SelectContext(ctx, &rows, s.reader.Rebind(q), args...); err != nil {
		return nil, "", fmt.Errorf("list threads: %w", err)
	}
	next := ""
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[len(rows)-1]
		next = encodeCursor(last.UpdatedAt, last.ThreadID)
	}
	out := make([]chat.Thread, len(rows))
	for i, r := range rows {
		out[i] = r.thread()
	}
	return out, next, nil
}

// MaxSearchWords bounds the words of a thread search that count; the rest
// are ignored.
const MaxSearchWords = 8

// likeEscaper makes a word a literal inside a LIKE pattern (ESCAPE '\').
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

func encodeCursor(updated int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(updated, 10) + ":" + id))
}

func decodeCursor(c string) (int64, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, "", err
	}
	ts, id, ok := strings.Cut(string(b), ":")
	if !ok || !strings.HasPrefix(id, chat.PrefixThread) {
		return 0, "", errors.New("malformed cursor")
	}
	n, err := strconv.ParseInt(ts, 10, 64)
	return n, id, err
}

// Thread returns one thread of the user.
func (s *Store) Thread(ctx context.Context, userID, threadID string) (chat.Thread, error) {
	if err := s.settled(ctx); err != nil {
		return chat.Thread{}, err
	}
	row, err := readThread(ctx, s.reader, userID, threadID)
	if err != nil {
		return chat.Thread{}, err
	}
	return row.thread(), nil
}

// Snapshot reads a thread's state in one consistent read: the head's
// history and the run in flight with its partial text.
//
// On SQLite the deltas only memory holds yet (streambuf.go) are part of
// it: the snapshot ends at the last seq handed out, and the partial text
// includes them.
func (s *Store) Snapshot(ctx context.Context, userID, threadID string) (chat.Snapshot, error) {
	return s.snapshot(ctx, userID, threadID, nil)
}

// snapshot is Snapshot whose history is only the part w picks (nil: the
// whole history).
func (s *Store) snapshot(ctx context.Context, userID, threadID string, w *historyWindow) (chat.Snapshot, error) {
	var snap chat.Snapshot
	var pending []*pendingBatch
	// (Before the thread's sequencer is held: recording a journaled
	// cancel takes it.)
	if err := s.settled(ctx); err != nil {
		return snap, err
	}
	if s.buf != nil {
		ts := s.buf.thread(threadID)
		ts.mu.Lock()
		defer ts.mu.Unlock()
		pending = ts.pending
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		var err error
		snap, err = readSnapshot(ctx, q, s.cps, userID, threadID, w)
		return err
	})
	if err != nil || len(pending) == 0 {
		return snap, err
	}
	if s.pg && pending[0].first != snap.LastSeq+1 {
		// Another instance wrote past this process's reservation
		// (streambuf.go): what memory holds is lost. (On SQLite this
		// process is the only writer: they always join.)
		return snap, nil
	}
	snap.LastSeq = pending[len(pending)-1].last
	if a := snap.ActiveRun; a != nil {
		a.LastSeq = snap.LastSeq
		// Nothing pending is published (a publish writes its thread's
		// pending deltas first): the run's latest pending message is the
		// one in flight, written in part (the database's) or not at all.
		inFlight := ""
		for _, pb := range pending {
			if pb.runID == a.RunID {
				inFlight = pb.messageID
			}
		}
		if inFlight != "" {
			var text strings.Builder
			if a.MessageID != nil && *a.MessageID == inFlight {
				text.WriteString(a.PartialText)
			}
			for _, pb := range pending {
				if pb.messageID == inFlight {
					for _, t := range pb.texts {
						text.WriteString(t)
					}
				}
			}
			a.MessageID, a.PartialText = &inFlight, text.String()
		}
	}
	return snap, nil
}

func readSnapshot(
	ctx context.Context,
	q *sqlx.Tx,
	cps *chainCache,
	userID, threadID string,
	w *historyWindow,
) (chat.Snapshot, error) {
	row, err := readThread(ctx, q, userID, threadID)
	if err != nil {
		return chat.Snapshot{}, err
	}
	head, err := loadCheckpoint(ctx, q, cps, threadID, row.HeadCheckpointID)
	if err != nil {
		return chat.Snapshot{}, err
	}
	ids, earlier := head.MessageIDs, 0
	if w != nil {
		from, to, err := w.pick(ctx, q, head.MessageIDs)
		if err != nil {
			return chat.Snapshot{}, err
		}
		ids, earlier = head.MessageIDs[from:to], from
	}
	msgs, err := loadMessages(ctx, q, ids)
	if err != nil {
		return chat.Snapshot{}, err
	}
	queue, err := readQueue(ctx, q, threadID)
	if err != nil {
		return chat.Snapshot{}, err
	}
	wq := queue.wire()
	snap := chat.Snapshot{
		ThreadID: row.ThreadID, Title: row.Title, StateVersion: row.StateVersion,
		HeadCheckpointID: row.HeadCheckpointID, LastSeq: row.LastSeq, Messages: msgs, EarlierMessages: earlier,
		Queue: &wq,
	}
	var run runRow
	err = q.GetContext(ctx, &run, q.Rebind(`SELECT `+runCols+` FROM runs WHERE thread_id = ?
		AND status NOT IN ('completed', 'failed', 'cancelled')`), threadID)
	if errors.Is(err, sql.ErrNoRows) {
		snap.LastRun, err = readLastRun(ctx, q, threadID)
		return snap, err
	}
	if err != nil {
		return snap, fmt.Errorf("load active run: %w", err)
	}
	active := &chat.ActiveRun{RunID: run.RunID, Status: run.status(), LastSeq: row.LastSeq}
	// The message in flight: the run's latest streamed message that was not
	// published.
	var streaming struct {
		MessageID string `db:"message_id"`
		FirstSeq  int64  `db:"first_seq"`
	}
	err = q.GetContext(ctx, &streaming, q.Rebind(`SELECT message_id, first_seq FROM stream_messages WHERE run_id = ?
		AND message_id NOT IN (SELECT message_id FROM messages WHERE run_id = ?)
		ORDER BY first_seq DESC LIMIT 1`), run.RunID, run.RunID)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return snap, fmt.Errorf("load streaming message: %w", err)
	}
	if msgID := streaming.MessageID; msgID != "" {
		active.MessageID = &msgID
		// Up to the first seqs recorded lost among the message's, if any
		// (streambuf.go): its text is whole only that far, and so is a
		// fragment saved with this last_seq.
		lost, err := firstGap(ctx, q, threadID, streaming.FirstSeq, row.LastSeq)
		if err != nil {
			return snap, err
		}
		if lost != nil {
			active.LastSeq = lost.First - 1
		}
		var batches []deltaBatch
		if err := q.SelectContext(ctx, &batches, q.Rebind(`SELECT `+batchCols+` FROM stream_batches
			WHERE message_id = ? AND first_seq <= ? ORDER BY first_seq`), msgID, active.LastSeq); err != nil {
			return snap, fmt.Errorf("load partial text: %w", err)
		}
		deltas, err := expandBatches(batches, func(d bufferedDelta) bool { return d.Seq <= active.LastSeq })
		if err != nil {
			return snap, err
		}
		var text strings.Builder
		for _, d := range deltas {
			text.WriteString(d.Text)
		}
		active.PartialText = text.String()
	}
	snap.ActiveRun = active
	return snap, nil
}

// queryer is a read handle: the reader pool or a read transaction.
type queryer interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
	Rebind(query string) string
}

// readThread loads a thread of the user; another user's, or a deleted one,
// answers not_found.
func readThread(ctx context.Context, q queryer, userID, threadID string) (threadRow, error) {
	row, err := readAnyThread(ctx, q, threadID)
	if err == nil && (row.UserID != userID || row.DeletedAt.Valid) {
		return threadRow{}, chat.NotFound("thread", threadID)
	}
	return row, err
}

// readAnyThread loads a thread whoever owns it, deleted or not: for the
// store's own work (the event bus's recovery, which may have to deliver a
// thread.deleted), never on a user's behalf.
func readAnyThread(ctx context.Context, q queryer, threadID string) (threadRow, error) {
	var row threadRow
	err := q.GetContext(ctx, &row, q.Rebind(`SELECT `+threadCols+` FROM threads WHERE thread_id = ?`), threadID)
	if errors.Is(err, sql.ErrNoRows) {
		return threadRow{}, chat.NotFound("thread", threadID)
	}
	if err != nil {
		return threadRow{}, fmt.Errorf("load thread: %w", err)
	}
	return row, nil
}

// readLastRun reports the thread's latest run (all are finished when this is
// called), or nil when it never had one.
func readLastRun(ctx context.Context, q *sqlx.Tx, threadID string) (*chat.LastRun, error) {
	var run runRow
	err := q.GetContext(ctx, &run, q.Rebind(`SELECT `+runCols+` FROM runs WHERE thread_id = ?
		ORDER BY created_at DESC, run_id DESC LIMIT 1`), threadID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load last run: %w", err)
	}
	ops, err := operationOutcomes(ctx, q, run.RunID)
	if err != nil {
		return nil, err
	}
	return &chat.LastRun{
		RunID:                run.RunID,
		Status:               run.status(),
		Error:                fromNullString(run.Error),
		DiscardedStreamChars: run.DiscardedStreamChars,
		PublishedMessageID:   fromNullString(run.CancelPublishedMessageID),
		ResumeCheckpointID:   fromNullString(run.ResumeCheckpointID),
		Operations:           ops,
	}, nil
}

// loadMessages returns the messages with the given ids, in that order.
func loadMessages(ctx context.Context, q *sqlx.Tx, ids []string) ([]chat.Message, error) {
	out := make([]chat.Message, 0, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	query, args, err := sqlx.In(`SELECT `+messageCols+` FROM messages WHERE message_id IN (?)`, ids)
	if err != nil {
		return nil, err
	}
	var rows []messageRow
	if err := q.SelectContext(ctx, &rows, q.Rebind(query), args...); err != nil {
		return nil, fmt.Errorf("load messages: %w", err)
	}
	byID := make(map[string]messageRow, len(rows))
	for _, r := range rows {
		byID[r.MessageID] = r
	}
	for _, id := range ids {
		r, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("checkpoint names missing message %s", id)
		}
		m, err := r.message()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// Checkpoints lists a thread's checkpoints, oldest first, with its head.
func (s *Store) Checkpoints(ctx context.Context, userID, threadID string) (string, []chat.Checkpoint, error) {
	var out []chat.Checkpoint
	head, err := s.checkpointRows(ctx, userID, threadID, func(rows []checkpointRow) error {
		var errs []error
		if out, errs = wholeCheckpoints(rows); len(errs) > 0 {
			return errs[0]
		}
		return nil
	})
	return head, out, err
}

// CheckpointDeltas lists a thread's checkpoints as Checkpoints does, each
// with its lists told as what they change from its parent's
// (chat.CheckpointDelta): the answer grows with the number of
// checkpoints, where Checkpoints' grows with that number times the
// conversation's length.
func (s *Store) CheckpointDeltas(ctx context.Context, userID, threadID string) (string, []chat.CheckpointDelta, error) {
	var out []chat.CheckpointDelta
	head, err := s.checkpointRows(ctx, userID, threadID, func(rows []checkpointRow) error {
		var errs []error
		if out, errs = deltaCheckpoints(rows); len(errs) > 0 {
			return errs[0]
		}
		return nil
	})
	return head, out, err
}

// checkpointRows reads the thread's head and its checkpoints' rows, oldest
// first, and hands the rows to decode within the read.
func (s *Store) checkpointRows(ctx context.Context, userID, threadID string, decode func([]checkpointRow) error) (string, error) {
	var head string
	if err := s.settled(ctx); err != nil {
		return "", err
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		row, err := readThread(ctx, q, userID, threadID)
		if err != nil {
			return err
		}
		head = row.HeadCheckpointID
		var rows []checkpointRow
		if err := q.SelectContext(ctx, &rows, q.Rebind(`SELECT `+checkpointCols+` FROM checkpoints WHERE thread_id = ?
			ORDER BY state_version`), threadID); err != nil {
			return fmt.Errorf("list checkpoints: %w", err)
		}
		return decode(rows)
	})
	return head, err
}

// Checkout makes checkpointID, any checkpoint of the thread, its head: the
// branch a user switches to (an earlier request before it was edited, a
// reply before it was regenerated). It is a durable event,
// thread.head_moved, so every tab follows and a tab that saw an older
// version gets the conflict; refused with run_already_active while a run
// of the thread has not ended (its steps write to the head). Checking out
// the head changes nothing and answers with the current version.
func (s *Store) Checkout(ctx context.Context, p chat.Checkout) (chat.CheckoutAck, error) {
	if err := p.Validate(); err != nil {
		return chat.CheckoutAck{}, err
	}
	userID, threadID, checkpointID, expected := p.UserID, p.ThreadID, p.CheckpointID, p.ExpectedStateVersion
	var out chat.CheckoutAck
	err := s.write(ctx, func(t *txn) error {
		c, cp, err := t.threadAt(userID, threadID, checkpointID)
		if err != nil {
			return err
		}
		if err := t.checkVersion(c, expected, ""); err != nil {
			return err
		}
		if err := t.noActiveRun(threadID); err != nil {
			return err
		}
		if checkpointID == c.row.HeadCheckpointID {
			out = chat.CheckoutAck{HeadCheckpointID: checkpointID, StateVersion: c.row.StateVersion}
			return nil
		}
		// A point from before a draft was deleted would bring the deleted
		// text back into history (and retention may have emptied it).
		if len(cp.MessageIDs) > 0 {
			q, args, err := sqlx.In(
				`SELECT message_id FROM messages WHERE message_id IN (?) AND deleted_at IS NOT NULL LIMIT 1`,
				cp.MessageIDs,
			)
			if err != nil {
				return err
			}
			var deleted string
			err = t.get(&deleted, q, args...)
			if err == nil {
				return chat.Invalid(
					"checkpoint %s holds the saved fragment %s, deleted since: switch to a later point of that branch",
					checkpointID, deleted,
				)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look for deleted drafts: %w", err)
			}
		}
		ev := t.event(c, chat.EventThreadHeadMoved, "")
		ev.Body = chat.ThreadHeadMovedBody{
			HeadCheckpointID:         checkpointID,
			PreviousHeadCheckpointID: c.row.HeadCheckpointID,
		}
		if err := t.append(ev); err != nil {
			return err
		}
		t.setHead(c, checkpointID)
		if err := t.pauseQueue(c, chat.PausedHeadMoved); err != nil {
			return err
		}
		out = chat.CheckoutAck{HeadCheckpointID: checkpointID, StateVersion: c.row.StateVersion}
		return nil
	})
	return out, err
}

// Fork copies the state at fromCheckpointID into a new thread of the same
// user; the original is untouched.
func (s *Store) Fork(ctx context.Context, p chat.Fork) (chat.Thread, error) {
	if err := p.Validate(); err != nil {
		return chat.Thread{}, err
	}
	userID, threadID, fromCheckpointID := p.UserID, p.ThreadID, p.FromCheckpointID
	newID := chat.NewID(chat.PrefixThread)
	err := s.write(ctx, func(t *txn) error {
		src, cp, err := t.threadAt(userID, threadID, fromCheckpointID)
		if err != nil {
			return err
		}
		title := forkTitle(src.row.Title)
		return t.createThread(
			userID,
			newID,
			title,
			&chat.ForkSource{ThreadID: threadID, CheckpointID: fromCheckpointID},
			chat.Checkpoint{
				MessageIDs:     cp.MessageIDs,
				CompletedSteps: cp.CompletedSteps,
				ToolResults:    cp.ToolResults,
				Pending:        cp.Pending,
			},
		)
	})
	if err != nil {
		return chat.Thread{}, err
	}
	return s.Thread(ctx, userID, newID)
}

func forkTitle(title string) string {
	t := title + " (fork)"
	if len(t) > MaxTitleLength {
		return title
	}
	return t
}

// RenameThread changes a thread's title. The title is a label, not
// conversation state: it bumps neither state_version nor the event log, so
// renaming never makes another tab's next command stale.
func (s *Store) RenameThread(ctx context.Context, userID, threadID, title string) error {
	return s.write(ctx, func(t *txn) error {
		res, err := t.exec(
			`UPDATE threads SET title = ?, updated_at = ? WHERE thread_id = ? AND user_id = ? AND deleted_at IS NULL`,
			title, ms(t.now), threadID, userID,
		)
		if err != nil {
			return fmt.Errorf("rename thread: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return chat.NotFound("thread", threadID)
		}
		return nil
	})
}

// DeleteThread deletes a thread of the user in one durable event,
// thread.deleted, its last: every tab on it is told, and from then on the
// thread answers not_found to everyone (its owner too) and takes no
// command; a fork of it keeps its history. Refused with run_already_active
// while a run of the thread has not ended (the engine cancels it first,
// see engine.DeleteThread); with expected set, a stale version is a
// state_version_conflict. The text stays, for audit, until retention
// empties it (RedactDeletedThreads).
func (s *Store) DeleteThread(
	ctx context.Context,
	userID, threadID string,
	expected *int64,
) (chat.ThreadDeletedAck, error) {
	err := s.write(ctx, func(t *txn) error {
		c, err := t.thread(userID, threadID)
		if err != nil {
			return err
		}
		if expected != nil {
			if err := t.checkVersion(c, *expected, ""); err != nil {
				return err
			}
		}
		if err := t.noActiveRun(threadID); err != nil {
			return err
		}
		if err := t.append(t.event(c, chat.EventThreadDeleted, "")); err != nil {
			return err
		}
		t.release(c) // nothing streams on it again
		now := ms(t.now)
		if _, err := t.exec(`UPDATE threads SET deleted_at = ?, updated_at = ? WHERE thread_id = ?`,
			now, now, threadID); err != nil {
			return fmt.Errorf("delete thread: %w", err)
		}
		c.row.DeletedAt = sql.NullInt64{Int64: now, Valid: true}
		// What waited in its queue was never sent: it goes with the thread.
		if _, err := t.exec(`UPDATE queue_items SET state = 'removed', user_message = '', updated_at = ?
			WHERE thread_id = ? AND state = 'waiting'`, now, threadID); err != nil {
			return fmt.Errorf("empty the deleted thread's queue: %w", err)
		}
		return nil
	})
	if err != nil {
		return chat.ThreadDeletedAck{}, err
	}
	return chat.ThreadDeletedAck{ThreadID: threadID}, nil
}

// Retitle gives a thread title to, when its title is still from: the
// engine's name for a conversation (engine.Titler), which never replaces
// a title the user chose or changed. A title is a label: no event, no
// version, and the thread keeps its place in the list.
func (s *Store) Retitle(ctx context.Context, threadID, from, to string) error {
	return s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`UPDATE threads SET title = ? WHERE thread_id = ? AND title = ? AND deleted_at IS NULL`,
			to, threadID, from); err != nil {
			return fmt.Errorf("retitle thread: %w", err)
		}
		return nil
	})
}
