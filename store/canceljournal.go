package store

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// The cancel journal: a cancel acknowledged without waiting for the writer
// (SQLite with Exclusive; nil otherwise).
//
// On SQLite every write commits through one connection and each commit
// waits for its sync, which on a busy virtual disk stalls for 15-90 ms at
// times (BENCHMARKS.md, issue 31). A cancel recorded by a transaction of
// its own waits for the commit in progress first, then for its own. The
// journal takes both waits off its path: a lone cancel that arrives while
// the writer's commit has been in its sync for journalStall or more is
// decided from the last committed state (read on a reader connection),
// appended to a file of its own and synced there, and acknowledged; the
// writer records it, with exactly those values, ahead of everything else
// in its next transaction. (Several cancels at once, or a writer that is
// not stalled, go through the writer as before: see journalCancel.)
//
// Why the values the ack gave are the ones recorded:
//   - The state is read while no transaction body runs, and registered
//     under mu only if no body began and no commit ended since (epoch),
//     and only if the transaction being committed did not touch the run
//     or its thread (committing): the committed state read is the
//     thread's latest.
//   - Every transaction whose body starts later applies the journaled
//     cancels first, before it reads anything (beginBody): nothing moves
//     the thread's state_version between the decision and the record.
//   - A thread with a journaled cancel not yet applied takes no second one
//     through the journal (that cancel goes through the writer).
//
// An acknowledged cancel is durable: synced to the journal, or committed
// (when the journal cannot be written, the cancel waits for the
// transaction that applies it). Open applies, before anything else, each
// record whose run has no cancel yet, then empties the file. Reads that
// show a run or a thread to a client (settled) wait until the cancels
// journaled before them are applied, so whoever got an ack never reads the
// state from before it.
type cancelJournal struct {
	mu   sync.Mutex
	idle *sync.Cond // on mu: signalled when a body ends
	// body: a transaction body runs on the writer. committing: the threads
	// and runs the transaction now committing touched (nil when none).
	body       bool
	committing map[string]bool
	epoch      uint64             // counts commitStarts and ends: what a cancel read may be older than
	since      time.Time          // when the commit in progress began (with committing)
	pending    []*journaledCancel // not yet in the database, in order
	count      atomic.Int32       // len(pending)
	deciding   atomic.Int32       // cancels in journalCancel now
	// closed: Store.Close began; cancels go through the writer from then
	// on. The field s.journal itself stays set, since the stream buffer's
	// flusher still writes (and reads it) until Close stops that too.
	closed atomic.Bool

	fileMu   sync.Mutex // appends to f and its truncation
	f        *os.File
	size     int64      // bytes appended since the last truncation
	appended int64      // records appended, ever (under fileMu)
	syncMu   sync.Mutex // one sync at a time
	synced   int64      // records appended before the last sync began (under syncMu)

	wake chan struct{} // cap 1: the applier has cancels to record
	stop context.CancelFunc
	done chan struct{}

	// mismatches counts records the writer found with another
	// state_version than the ack gave (a bug; tests require zero).
	mismatches atomic.Int64
}

// journaledCancel is one record and its state in this process.
type journaledCancel struct {
	rec     cancelRecord
	applied chan struct{} // closed once the database holds it
}

// journalSuffix names the journal file beside the database.
const journalSuffix = "-cancels"

// openCancelJournal opens (creating it, private) the journal of the
// database at dbPath and returns it with the records it holds.
func openCancelJournal(dbPath string) (*cancelJournal, []cancelRecord, error) {
	path := dbPath + journalSuffix
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, FileMode)
	if err != nil {
		return nil, nil, fmt.Errorf("open the cancel journal %s: %w", path, err)
	}
	recs, err := readJournal(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("read the cancel journal %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("read the cancel journal %s: %w", path, err)
	}
	j := &cancelJournal{f: f, size: info.Size(), wake: make(chan struct{}, 1), done: make(chan struct{})}
	j.idle = sync.NewCond(&j.mu)
	return j, recs, nil
}

// readJournal reads every whole record of f. A last line without its
// newline is a record whose sync never returned (never acknowledged) and
// is left out.
func readJournal(f *os.File) ([]cancelRecord, error) {
	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}
	var recs []cancelRecord
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) { // line (if any) is a torn last record
			return recs, nil
		}
		if err != nil {
			return nil, err
		}
		var rec cancelRecord
		if jerr := json.Unmarshal(bytes.TrimSpace(line), &rec); jerr != nil || rec.RunID == "" {
			return nil, fmt.Errorf("record %d is not a cancel (%.80q): the file holds cancels acknowledged "+
				"before the last stop; to start anyway, move it aside, then cancel the runs it names again", len(recs)+1,
				line)
		}
		recs = append(recs, rec)
	}
}

// replayJournal records, at start, the journaled cancels the database
// does not hold yet, then empties the journal. Called by Open before
// anything else writes.
func (s *Store) replayJournal(ctx context.Context, recs []cancelRecord) error {
	if len(recs) > 0 {
		err := s.write(ctx, func(t *txn) error {
			for _, rec := range recs {
				if err := t.applyCancel(rec, &s.journal.mismatches); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("record the journaled cancels: %w", err)
		}
	}
	return s.journal.truncate()
}

// start starts the applier, owned by the store: it makes sure a journaled
// cancel is recorded soon even when nothing else writes.
func (j *cancelJournal) start(s *Store) {
	ctx, stop := context.WithCancel(context.Background())
	j.stop = stop
	go func() {
		defer close(j.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-j.wake:
			}
			if j.count.Load() == 0 {
				continue
			}
			// An urgent transaction with no work of its own: beginBody
			// hands it the journaled cancels. A failure leaves them
			// pending for the next transaction; Close records them.
			_ = s.writeUrgent(ctx, func(*txn) error { return nil })
		}
	}()
}

// close stops the applier, records what is pending and empties the file.
// Called by Store.Close before the stream buffer is written.
func (j *cancelJournal) close(s *Store) error {
	if j.closed.Swap(true) {
		return nil
	}
	if j.stop != nil {
		j.stop()
		<-j.done
	}
	var err error
	if j.count.Load() > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), storeCloseTimeout)
		err = s.write(ctx, func(*txn) error { return nil })
		cancel()
	}
	if err == nil && j.count.Load() == 0 {
		err = j.truncate()
	}
	return errors.Join(err, j.f.Close())
}

// journalCancel decides and acknowledges p through the journal when it
// can (decided false: the caller records it through the writer).
func (s *Store) journalCancel(ctx context.Context, p chat.CancelRun) (
	ack chat.CancelAck, prev chat.RunStatus, err error, decided bool,
) {
	j := s.journal
	if j.deciding.Add(1) > 1 || j.closed.Load() || j.count.Load() > 0 || s.queue.waiting.Load() > 0 || s.gate.free() {
		// Several cancels at once go through the writer, which records
		// up to maxGroup of them per commit; through the journal each
		// would wait for the transaction recording the others (measured:
		// a burst of 500 took 43 ms p50 that way, against under 10 ms
		// p99 through the writer). And a free writer is quicker to the
		// truth.
		j.deciding.Add(-1)
		return ack, prev, nil, false
	}
	defer j.deciding.Add(-1)
	var jc *journaledCancel
	for attempt := 0; ; attempt++ {
		if attempt == journalAttempts {
			return ack, prev, nil, false
		}
		// Between two bodies, the state committed is the thread's latest
		// unless the transaction committing touched it (see above).
		j.mu.Lock()
		for i := 0; j.body && i < journalAttempts; i++ {
			j.idle.Wait()
		}
		busy, epoch, committing := j.body, j.epoch, j.committing
		stalled := committing != nil && time.Since(j.since) >= journalStall
		j.mu.Unlock()
		if busy || !stalled {
			return ack, prev, nil, false
		}
		seen, err := s.readForCancel(ctx, p, committing)
		if err != nil || seen.undecided {
			return ack, prev, nil, false // the writer decides (and says what is wrong)
		}
		j.mu.Lock()
		if j.body || j.epoch != epoch { // a body began, or a commit ended, while it read: again
			j.mu.Unlock()
			continue
		}
		jc, prev, err = seen.decide(j, p, s.clock())
		j.mu.Unlock()
		if err != nil || jc == nil {
			return ack, prev, err, err != nil
		}
		break
	}
	select {
	case j.wake <- struct{}{}:
	default:
	}
	if werr := j.append(jc.rec); werr != nil {
		// Not durable in the journal: durable once the writer recorded it.
		select {
		case <-jc.applied:
		case <-ctx.Done():
			return ack, prev, ctx.Err(), true
		}
	}
	s.metrics.CancelJournaled()
	return jc.rec.ack(), prev, nil, true
}

// journalStall is how long the commit in progress must have lasted for a
// cancel to take the journal. A commit here takes 0.5-1 ms, and a cancel
// behind it waits that long at most; one that lasts longer is stalled in
// its sync, which lasts 15-90 ms when it does (BENCHMARKS.md). Taking the
// journal costs a sync of its own and a second record of the cancel:
// with every cancel that found the writer busy taking it, the cancel
// benchmark's ack p99 was 9.4-11.2 ms against 5.8-9.1 ms without.
const journalStall = 2 * time.Millisecond

// journalAttempts bounds how often a cancel waits for a body to end, or
// reads again because a commit ended while it read, before it goes
// through the writer instead.
const journalAttempts = 4

// cancelSeen is what a cancel read of its run as committed.
type cancelSeen struct {
	undecided bool // the writer must decide: the run or its thread is being committed
	found     bool // the run exists and is the user's, its thread not deleted
	row       runRow
	th        threadRow
	head      chat.Checkpoint
}

// readForCancel reads p's run, its thread and its head as committed.
func (s *Store) readForCancel(ctx context.Context, p chat.CancelRun, committing map[string]bool) (cancelSeen, error) {
	var seen cancelSeen
	if committing[p.RunID] {
		seen.undecided = true
		return seen, nil
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		err := q.GetContext(ctx, &seen.row, `SELECT `+runCols+` FROM runs WHERE run_id = ?`, p.RunID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("load run: %w", err)
		}
		if committing[seen.row.ThreadID] {
			seen.undecided = true
			return nil
		}
		if err := q.GetContext(ctx, &seen.th, `SELECT `+threadCols+` FROM threads WHERE thread_id = ?`,
			seen.row.ThreadID); err != nil {
			return fmt.Errorf("load thread: %w", err)
		}
		if seen.th.UserID != p.UserID || seen.th.DeletedAt.Valid {
			return nil
		}
		seen.found = true
		seen.head, err = loadCheckpoint(ctx, q, s.cps, seen.th.ThreadID, seen.th.HeadCheckpointID)
		return err
	})
	return seen, err
}

// decide answers p from what was seen, or registers it as a journaled
// cancel (jc), or leaves it to the writer (nil, nil: a second cancel,
// whose answer and audit the writer gives, or a thread with a journaled
// cancel already). Called with j.mu held, no body running, and nothing
// committed since the read.
func (seen cancelSeen) decide(j *cancelJournal, p chat.CancelRun, now time.Time) (*journaledCancel, chat.RunStatus, error) {
	if !seen.found {
		return nil, "", chat.NotFound("run", p.RunID) // another user's: as unknown as a random id
	}
	row, th := seen.row, seen.th
	prev := row.status()
	if err := cancellable(row); err != nil {
		return nil, prev, err
	}
	if prev.CancelAccepted() || transition(row, chat.RunCancelRequested) != nil {
		return nil, "", nil
	}
	for _, pc := range j.pending {
		if pc.rec.ThreadID == th.ThreadID || pc.rec.RunID == row.RunID {
			return nil, "", nil
		}
	}
	jc := &journaledCancel{applied: make(chan struct{}), rec: cancelRecord{
		RunID: row.RunID, ThreadID: th.ThreadID, UserID: p.UserID, Reason: p.Reason, RequestedBy: p.RequestedBy,
		At: ms(now), StateVersion: th.StateVersion + 1, ResumeCheckpointID: seen.head.CheckpointID,
		PublishedMessageID: lastMessage(seen.head), AuditID: chat.NewID("aud_"),
	}}
	j.pending = append(j.pending, jc)
	j.count.Add(1)
	return jc, prev, nil
}

// append writes rec to the journal and returns once it is synced. Cancels
// appended while a sync runs share the next one.
func (j *cancelJournal) append(rec cancelRecord) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	j.fileMu.Lock()
	n, err := j.f.Write(line)
	j.size += int64(n)
	j.appended++
	mine := j.appended
	j.fileMu.Unlock()
	if err != nil {
		return fmt.Errorf("append to the cancel journal: %w", err)
	}
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= mine {
		return nil // a sync that began after its write covered it
	}
	j.fileMu.Lock()
	through := j.appended
	j.fileMu.Unlock()
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("sync the cancel journal: %w", err)
	}
	j.synced = through
	return nil
}

// truncate empties the file once nothing is pending (a record appended
// after the check lands after the truncation, under fileMu). Not synced:
// records that come back after a crash are found recorded and skipped.
func (j *cancelJournal) truncate() error {
	j.fileMu.Lock()
	defer j.fileMu.Unlock()
	if j.size == 0 || j.count.Load() > 0 {
		return nil
	}
	if err := j.f.Truncate(0); err != nil {
		return fmt.Errorf("empty the cancel journal: %w", err)
	}
	j.size = 0
	return nil
}

// journaledOutside counts the records in the journal of the database at
// dbPath, for a process that does not own it (gateway check).
func journaledOutside(dbPath string) int {
	f, err := os.Open(dbPath + journalSuffix)
	if err != nil {
		return 0
	}
	defer f.Close()
	recs, _ := readJournal(f)
	return len(recs)
}

// journalTurn is one write transaction's part in the journal: the
// journaled cancels it records first, and its phase (see cancelJournal).
// Its methods do nothing on a nil turn (no journal).
type journalTurn struct {
	j       *cancelJournal
	records []*journaledCancel
	ended   bool
}

// beginBody starts a transaction body on the writer (writer gate held):
// from here no cancel is decided by the journal until commitStarts.
func (j *cancelJournal) beginBody() *journalTurn {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.body = true
	return &journalTurn{j: j, records: slices.Clone(j.pending)}
}

// apply records the turn's journaled cancels in t, before its body.
func (u *journalTurn) apply(t *txn) error {
	if u == nil {
		return nil
	}
	for _, jc := range u.records {
		if err := t.applyCancel(jc.rec, &u.j.mismatches); err != nil {
			return err
		}
	}
	return nil
}

// commitStarts ends the body: t commits now, and until it committed a
// cancel of a run or thread it touched is not decided by the journal.
func (u *journalTurn) commitStarts(t *txn) {
	if u == nil {
		return
	}
	touched := make(map[string]bool, len(t.threads)+len(t.held)+len(t.changedRuns)+len(t.runsRead))
	for id := range t.threads {
		touched[id] = true
	}
	for id := range t.held {
		touched[id] = true
	}
	for _, id := range t.changedRuns {
		touched[id] = true
	}
	for _, id := range t.runsRead {
		touched[id] = true
	}
	u.j.mu.Lock()
	u.j.body = false
	u.j.committing = touched
	u.j.since = time.Now()
	u.j.epoch++
	u.j.mu.Unlock()
	u.j.idle.Broadcast()
}

// end ends the turn once the transaction committed (its records are in
// the database) or did not (they stay pending). Safe to call twice.
func (u *journalTurn) end(committed bool) {
	if u == nil || u.ended {
		return
	}
	u.ended = true
	j := u.j
	j.mu.Lock()
	j.body = false
	j.committing = nil
	j.epoch++
	done := 0
	if committed && len(u.records) > 0 {
		j.pending = slices.DeleteFunc(j.pending, func(jc *journaledCancel) bool {
			return slices.Contains(u.records, jc)
		})
		done = len(u.records)
		j.count.Store(int32(len(j.pending)))
	}
	j.mu.Unlock()
	j.idle.Broadcast()
	if done > 0 {
		for _, jc := range u.records {
			close(jc.applied)
		}
		_ = j.truncate() // a failure leaves records that are found recorded
	}
}

// applyCancel records a journaled cancel (at start, or first in a
// transaction). A run whose cancel is recorded already is skipped; a run
// that ended otherwise cannot be one the journal took (the transaction
// that ended it would have recorded the cancel first) and is left as the
// database says, counted in mismatches.
func (t *txn) applyCancel(rec cancelRecord, mismatches *atomic.Int64) error {
	row, err := t.run(rec.RunID)
	if chat.ErrorCode(err) == chat.CodeNotFound {
		mismatches.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	if st := row.status(); st.CancelAccepted() || st.Terminal() {
		if !st.CancelAccepted() || row.CancelStateVersion.Int64 != rec.StateVersion {
			mismatches.Add(1)
		}
		return nil
	}
	c, err := t.engineThread(row.ThreadID)
	if err != nil {
		return err
	}
	if c.row.DeletedAt.Valid { // (its deletion would have recorded the cancel first)
		mismatches.Add(1)
		return nil
	}
	ack, err := t.recordCancel(c, row, rec)
	if err != nil {
		return err
	}
	if ack.AcceptedStateVersion != rec.StateVersion {
		mismatches.Add(1)
	}
	return nil
}

// settled waits until the cancels journaled before it are recorded, so
// that a read after a cancel's ack shows it. Cheap when none is pending.
func (s *Store) settled(ctx context.Context) error {
	j := s.journal
	if j == nil || j.count.Load() == 0 {
		return nil
	}
	j.mu.Lock()
	waits := make([]chan struct{}, 0, len(j.pending))
	for _, jc := range j.pending {
		waits = append(waits, jc.applied)
	}
	j.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// recorded are the journaled cancels the turn records (none on a nil turn).
func (u *journalTurn) recorded() []*journaledCancel {
	if u == nil {
		return nil
	}
	return u.records
}
