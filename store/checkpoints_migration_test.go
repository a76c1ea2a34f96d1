package store

import (
	"context"
	"strings"
	"testing"
)

// Migration 16 stores checkpoints appended to their parents. Its Down
// goes through while no checkpoint is stored so, and is refused (the
// database unchanged) once one is: a version before it would read the
// appended lists as whole ones.
func TestCheckpointAppendedMigrationDown(t *testing.T) {
	ctx := context.Background()
	_, db, p := migrationProvider(t)
	if _, err := p.UpTo(ctx, 16); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 15); err != nil {
		t.Fatalf("down from 16 with no appended checkpoint: %v", err)
	}
	if _, err := p.UpTo(ctx, 16); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO threads (thread_id, user_id, title, state_version, last_seq, head_checkpoint_id, created_at, updated_at)
			VALUES ('thr_m', 'usr_local', 't', 2, 2, 'cp_2', 0, 0)`,
		`INSERT INTO checkpoints (checkpoint_id, thread_id, parent_checkpoint_id, state_version, message_ids, completed_steps, tool_results, created_at, appended)
			VALUES ('cp_1', 'thr_m', NULL, 1, '["msg_1"]', '[]', '[]', 0, 0)`,
		`INSERT INTO checkpoints (checkpoint_id, thread_id, parent_checkpoint_id, state_version, message_ids, completed_steps, tool_results, created_at, appended)
			VALUES ('cp_2', 'thr_m', 'cp_1', 2, '["msg_2"]', '["generate"]', '[]', 0, 1)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.DownTo(ctx, 15)
	if err == nil || !strings.Contains(err.Error(), "checkpoints") {
		t.Fatalf("down from 16 with an appended checkpoint = %v, want refused naming the checkpoints", err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != 16 {
		t.Fatalf("after the refused down: version %d, %v; want 16", v, err)
	}
	var appended int
	if err := db.QueryRowContext(ctx, `SELECT appended FROM checkpoints WHERE checkpoint_id = 'cp_2'`).Scan(&appended); err != nil || appended != 1 {
		t.Fatalf("after the refused down: cp_2 appended = %d, %v; want 1", appended, err)
	}
}
