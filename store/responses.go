package store

// Runs as responses of the OpenAI Responses API (docs/openai-api.md): the
// row a Responses request writes with the run it starts, and the one read
// that tells the gateway everything it says about a response.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// recordResponse writes what a Responses API request said with the run it
// starts, in the start's transaction.
func (t *txn) recordResponse(runID string, r chat.ResponseRequest) error {
	meta := r.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	if _, err := t.exec(`INSERT INTO responses (run_id, model, instructions, metadata, previous_response_id, background)
		VALUES (?, ?, ?, ?, ?, ?)`,
		runID, r.Model, r.Instructions, mustJSON(meta), nullStr(r.PreviousResponseID), r.Background); err != nil {
		return fmt.Errorf("record the response request: %w", err)
	}
	return nil
}

// readInstructions is the system message a run's Responses API request
// gave ("" for none, or a run started otherwise).
func readInstructions(ctx context.Context, q *sqlx.Tx, runID string) (string, error) {
	var s string
	err := q.GetContext(ctx, &s, q.Rebind(`SELECT instructions FROM responses WHERE run_id = ?`), runID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("load the run's instructions: %w", err)
	}
	return s, nil
}

// redactResponses empties what the Responses API requests of a deleted
// thread's runs said (instructions, metadata), with its messages.
func (t *txn) redactResponses(threadID string) error {
	if _, err := t.exec(`UPDATE responses SET instructions = '', metadata = '{}'
		WHERE run_id IN (SELECT run_id FROM runs WHERE thread_id = ?)`, threadID); err != nil {
		return fmt.Errorf("redact the response requests of deleted thread %s: %w", threadID, err)
	}
	return nil
}

type responseRow struct {
	Model              string         `db:"model"`
	Instructions       string         `db:"instructions"`
	Metadata           string         `db:"metadata"`
	PreviousResponseID sql.NullString `db:"previous_response_id"`
	Background         bool           `db:"background"`
}

// Response reads one run of the user as a response: the run, its thread,
// what its Responses API request recorded (if it came that way), the
// assistant messages it published, the seq of its run.started, the
// checkpoint it ended on and its tool calls' outcomes — in one read
// transaction. Another user's run, or one of a deleted thread, is
// not_found.
func (s *Store) Response(ctx context.Context, userID, runID string) (chat.Response, error) {
	var out chat.Response
	if err := s.settled(ctx); err != nil {
		return out, err
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		var row runRow
		err := q.GetContext(ctx, &row, q.Rebind(`SELECT `+runCols+` FROM runs WHERE run_id = ?`), runID)
		if errors.Is(err, sql.ErrNoRows) {
			return chat.NotFound("run", runID)
		}
		if err != nil {
			return fmt.Errorf("load run: %w", err)
		}
		th, err := readThread(ctx, q, userID, row.ThreadID)
		if err != nil {
			if chat.ErrorCode(err) == chat.CodeNotFound {
				return chat.NotFound("run", runID) // never say whose thread it is
			}
			return err
		}
		out = chat.Response{Run: row.run(), Thread: th.thread(), CheckpointID: row.BaseCheckpointID,
			PublishedMessageID: fromNullString(row.CancelPublishedMessageID)}

		var rr responseRow
		err = q.GetContext(ctx, &rr, q.Rebind(`SELECT model, instructions, metadata, previous_response_id, background
			FROM responses WHERE run_id = ?`), runID)
		switch {
		case err == nil:
			req := &chat.ResponseRequest{Model: rr.Model, Instructions: rr.Instructions,
				PreviousResponseID: rr.PreviousResponseID.String, Background: rr.Background}
			if err := json.Unmarshal([]byte(rr.Metadata), &req.Metadata); err != nil {
				return fmt.Errorf("response %s metadata: %w", runID, err)
			}
			out.Request = req
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("load the response request: %w", err)
		}

		// Every message the run published, oldest first: the last one's
		// checkpoint is where the response ended; the assistant's text
		// (not the tool results) is its output.
		var msgs []messageRow
		if err := q.SelectContext(ctx, &msgs, q.Rebind(`SELECT `+messageCols+` FROM messages WHERE run_id = ?
			ORDER BY state_version`), runID); err != nil {
			return fmt.Errorf("load the run's messages: %w", err)
		}
		for _, r := range msgs {
			out.CheckpointID = r.CheckpointID
			if r.Role != chat.RoleAssistant || r.DeletedAt.Valid {
				continue
			}
			m, err := r.message()
			if err != nil {
				return err
			}
			out.Output = append(out.Output, m)
		}

		var seq sql.NullInt64
		if err := q.GetContext(ctx, &seq, q.Rebind(`SELECT MIN(seq) FROM events WHERE run_id = ? AND type = ?`),
			runID, chat.EventRunStarted); err != nil {
			return fmt.Errorf("find the run's run.started: %w", err)
		}
		out.StartSeq = seq.Int64
		out.Operations, err = operationOutcomes(ctx, q, runID)
		return err
	})
	if err != nil {
		return chat.Response{}, err
	}
	return out, nil
}
