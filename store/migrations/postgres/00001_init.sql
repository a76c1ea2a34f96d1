-- +goose Up
-- One schema for the four layers of a run's data: visible result (messages),
-- confirmed workflow state (threads, checkpoints), work in flight (runs,
-- operations, stream buffer) and execution traces (events, cancel audit).
-- Times are Unix milliseconds. JSON columns are TEXT. PostgreSQL: every text
-- column collates "C" (byte order), as SQLite compares text, so keyset
-- pagination and ordering agree on both databases.

CREATE TABLE users (
    user_id    TEXT COLLATE "C" PRIMARY KEY,
    name       TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL
);

INSERT INTO users (user_id, name, created_at) VALUES ('usr_local', 'local', 0);

CREATE TABLE threads (
    thread_id                 TEXT COLLATE "C" PRIMARY KEY,
    user_id                   TEXT COLLATE "C" NOT NULL REFERENCES users (user_id),
    title                     TEXT COLLATE "C" NOT NULL,
    state_version             BIGINT NOT NULL,
    last_seq                  BIGINT NOT NULL,
    head_checkpoint_id        TEXT COLLATE "C" NOT NULL,
    forked_from_thread_id     TEXT COLLATE "C",
    forked_from_checkpoint_id TEXT COLLATE "C",
    created_at                BIGINT NOT NULL,
    updated_at                BIGINT NOT NULL
);

CREATE INDEX threads_by_user_updated ON threads (user_id, updated_at, thread_id);

CREATE TABLE checkpoints (
    checkpoint_id        TEXT COLLATE "C" PRIMARY KEY,
    thread_id            TEXT COLLATE "C" NOT NULL REFERENCES threads (thread_id),
    parent_checkpoint_id TEXT COLLATE "C",
    state_version        BIGINT NOT NULL,
    message_ids          TEXT COLLATE "C" NOT NULL,
    completed_steps      TEXT COLLATE "C" NOT NULL,
    tool_results         TEXT COLLATE "C" NOT NULL,
    pending              TEXT COLLATE "C",
    run_id               TEXT COLLATE "C",
    created_at           BIGINT NOT NULL
);

CREATE INDEX checkpoints_by_thread ON checkpoints (thread_id, state_version);

-- Published blocks only. A deleted draft keeps its row (audit); only the
-- head checkpoint's message_ids decide what history is.
CREATE TABLE messages (
    message_id    TEXT COLLATE "C" PRIMARY KEY,
    thread_id     TEXT COLLATE "C" NOT NULL REFERENCES threads (thread_id),
    role          TEXT COLLATE "C" NOT NULL,
    kind          TEXT COLLATE "C" NOT NULL,
    content       TEXT COLLATE "C" NOT NULL,
    state_version BIGINT NOT NULL,
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    run_id        TEXT COLLATE "C",
    fragment_of   TEXT COLLATE "C",
    created_at    BIGINT NOT NULL
);

CREATE INDEX messages_by_thread ON messages (thread_id);

CREATE TABLE runs (
    run_id                 TEXT COLLATE "C" PRIMARY KEY,
    thread_id              TEXT COLLATE "C" NOT NULL REFERENCES threads (thread_id),
    status                 TEXT COLLATE "C" NOT NULL,
    base_checkpoint_id     TEXT COLLATE "C" NOT NULL,
    resume_checkpoint_id   TEXT COLLATE "C",
    resume_note            TEXT COLLATE "C" NOT NULL DEFAULT '',
    cancel_requested_at    BIGINT,
    cancel_reason          TEXT COLLATE "C",
    requested_by           TEXT COLLATE "C",
    cancel_state_version   BIGINT,
    cancel_published_message_id TEXT COLLATE "C",
    discarded_stream_chars BIGINT NOT NULL DEFAULT 0,
    error                  TEXT COLLATE "C",
    attempt                INTEGER NOT NULL DEFAULT 1,
    client_request_id      TEXT COLLATE "C",
    start_state_version    BIGINT NOT NULL,
    lease_owner            TEXT COLLATE "C",
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
    operation_id    TEXT COLLATE "C" PRIMARY KEY,
    run_id          TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id),
    thread_id       TEXT COLLATE "C" NOT NULL REFERENCES threads (thread_id),
    tool            TEXT COLLATE "C" NOT NULL,
    contract        TEXT COLLATE "C" NOT NULL,
    phase           TEXT COLLATE "C" NOT NULL,
    args            TEXT COLLATE "C" NOT NULL,
    preview         TEXT COLLATE "C",
    idempotency_key TEXT COLLATE "C",
    outcome         TEXT COLLATE "C",
    result_ref      TEXT COLLATE "C",
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

CREATE INDEX operations_by_thread ON operations (thread_id, created_at);
CREATE INDEX operations_by_run ON operations (run_id);

-- The per-thread log of durable events, payload as sent on the wire.
CREATE TABLE events (
    thread_id     TEXT COLLATE "C" NOT NULL,
    seq           BIGINT NOT NULL,
    type          TEXT COLLATE "C" NOT NULL,
    run_id        TEXT COLLATE "C",
    message_id    TEXT COLLATE "C",
    state_version BIGINT NOT NULL,
    ts            BIGINT NOT NULL,
    payload       TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE INDEX events_by_run ON events (run_id, seq);
CREATE INDEX events_by_message ON events (message_id);

-- The stream buffer: deltas, kept for the stream TTL, never history.
CREATE TABLE stream_deltas (
    thread_id  TEXT COLLATE "C" NOT NULL,
    seq        BIGINT NOT NULL,
    run_id     TEXT COLLATE "C" NOT NULL,
    message_id TEXT COLLATE "C" NOT NULL,
    part       INTEGER NOT NULL,
    text       TEXT COLLATE "C" NOT NULL,
    ts         BIGINT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE INDEX stream_deltas_by_message ON stream_deltas (message_id, seq);
CREATE INDEX stream_deltas_by_ts ON stream_deltas (ts);

-- One row per streamed message: outlives its deltas, so a purged fragment
-- answers fragment_unavailable instead of not_found, and a cancel can count
-- the discarded characters.
CREATE TABLE stream_messages (
    message_id TEXT COLLATE "C" PRIMARY KEY,
    thread_id  TEXT COLLATE "C" NOT NULL,
    run_id     TEXT COLLATE "C" NOT NULL,
    first_seq  BIGINT NOT NULL,
    parts      INTEGER NOT NULL,
    chars      BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX stream_messages_by_run ON stream_messages (run_id);

CREATE TABLE cancel_audit (
    audit_id               TEXT COLLATE "C" PRIMARY KEY,
    run_id                 TEXT COLLATE "C" NOT NULL,
    thread_id              TEXT COLLATE "C" NOT NULL,
    user_id                TEXT COLLATE "C" NOT NULL,
    requested_by           TEXT COLLATE "C" NOT NULL,
    reason                 TEXT COLLATE "C" NOT NULL,
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
