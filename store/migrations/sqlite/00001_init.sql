-- +goose Up
-- One schema for the four layers of a run's data: visible result (messages),
-- confirmed workflow state (threads, checkpoints), work in flight (runs,
-- operations, stream buffer) and execution traces (events, cancel audit).
-- Times are Unix milliseconds. JSON columns are TEXT.

CREATE TABLE users (
    user_id    TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

INSERT INTO users (user_id, name, created_at) VALUES ('usr_local', 'local', 0);

CREATE TABLE threads (
    thread_id                 TEXT PRIMARY KEY,
    user_id                   TEXT NOT NULL REFERENCES users (user_id),
    title                     TEXT NOT NULL,
    state_version             BIGINT NOT NULL,
    last_seq                  BIGINT NOT NULL,
    head_checkpoint_id        TEXT NOT NULL,
    forked_from_thread_id     TEXT,
    forked_from_checkpoint_id TEXT,
    created_at                BIGINT NOT NULL,
    updated_at                BIGINT NOT NULL
);

CREATE INDEX threads_by_user_updated ON threads (user_id, updated_at, thread_id);

CREATE TABLE checkpoints (
    checkpoint_id        TEXT PRIMARY KEY,
    thread_id            TEXT NOT NULL REFERENCES threads (thread_id),
    parent_checkpoint_id TEXT,
    state_version        BIGINT NOT NULL,
    message_ids          TEXT NOT NULL,
    completed_steps      TEXT NOT NULL,
    tool_results         TEXT NOT NULL,
    pending              TEXT,
    run_id               TEXT,
    created_at           BIGINT NOT NULL
);

CREATE INDEX checkpoints_by_thread ON checkpoints (thread_id, state_version);

-- Published blocks only. A deleted draft keeps its row (audit); only the
-- head checkpoint's message_ids decide what history is.
CREATE TABLE messages (
    message_id    TEXT PRIMARY KEY,
    thread_id     TEXT NOT NULL REFERENCES threads (thread_id),
    role          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    content       TEXT NOT NULL,
    state_version BIGINT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    run_id        TEXT,
    fragment_of   TEXT,
    created_at    BIGINT NOT NULL
);

CREATE INDEX messages_by_thread ON messages (thread_id);

CREATE TABLE runs (
    run_id                 TEXT PRIMARY KEY,
    thread_id              TEXT NOT NULL REFERENCES threads (thread_id),
    status                 TEXT NOT NULL,
    base_checkpoint_id     TEXT NOT NULL,
    resume_checkpoint_id   TEXT,
    resume_note            TEXT NOT NULL DEFAULT '',
    cancel_requested_at    BIGINT,
    cancel_reason          TEXT,
    requested_by           TEXT,
    cancel_state_version   BIGINT,
    cancel_published_message_id TEXT,
    discarded_stream_chars BIGINT NOT NULL DEFAULT 0,
    error                  TEXT,
    attempt                INTEGER NOT NULL DEFAULT 1,
    client_request_id      TEXT,
    start_state_version    BIGINT NOT NULL,
    lease_owner            TEXT,
    lease_expires_at       BIGINT,
    created_at             BIGINT NOT NULL,
    updated_at             BIGINT NOT NULL,
    finished_at            BIGINT
);

CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
CREATE UNIQUE INDEX runs_client_request ON runs (thread_id, client_request_id);
CREATE INDEX runs_by_status ON runs (status, created_at);

CREATE TABLE operations (
    operation_id    TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES runs (run_id),
    thread_id       TEXT NOT NULL REFERENCES threads (thread_id),
    tool            TEXT NOT NULL,
    contract        TEXT NOT NULL,
    phase           TEXT NOT NULL,
    args            TEXT NOT NULL,
    preview         TEXT,
    idempotency_key TEXT,
    outcome         TEXT,
    result_ref      TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

CREATE INDEX operations_by_thread ON operations (thread_id, created_at);
CREATE INDEX operations_by_run ON operations (run_id);

-- The per-thread log of durable events, payload as sent on the wire.
CREATE TABLE events (
    thread_id     TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    type          TEXT NOT NULL,
    run_id        TEXT,
    message_id    TEXT,
    state_version BIGINT NOT NULL,
    ts            BIGINT NOT NULL,
    payload       TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE INDEX events_by_run ON events (run_id, seq);
CREATE INDEX events_by_message ON events (message_id);

-- The stream buffer: deltas, kept for the stream TTL, never history.
CREATE TABLE stream_deltas (
    thread_id  TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    run_id     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    part       INTEGER NOT NULL,
    text       TEXT NOT NULL,
    ts         BIGINT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE INDEX stream_deltas_by_message ON stream_deltas (message_id, seq);
CREATE INDEX stream_deltas_by_ts ON stream_deltas (ts);

-- One row per streamed message: outlives its deltas, so a purged fragment
-- answers fragment_unavailable instead of not_found, and a cancel can count
-- the discarded characters.
CREATE TABLE stream_messages (
    message_id TEXT PRIMARY KEY,
    thread_id  TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    first_seq  BIGINT NOT NULL,
    parts      INTEGER NOT NULL,
    chars      BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX stream_messages_by_run ON stream_messages (run_id);

CREATE TABLE cancel_audit (
    audit_id               TEXT PRIMARY KEY,
    run_id                 TEXT NOT NULL,
    thread_id              TEXT NOT NULL,
    user_id                TEXT NOT NULL,
    requested_by           TEXT NOT NULL,
    reason                 TEXT NOT NULL,
    requested_at           BIGINT NOT NULL,
    accepted_state_version BIGINT NOT NULL,
    already_requested      BOOLEAN NOT NULL
);

CREATE INDEX cancel_audit_by_run ON cancel_audit (run_id);

-- +goose Down
DROP TABLE cancel_audit;
DROP TABLE stream_messages;
DROP TABLE stream_deltas;
DROP TABLE events;
DROP TABLE operations;
DROP TABLE runs;
DROP TABLE messages;
DROP TABLE checkpoints;
DROP TABLE threads;
DROP TABLE users;
