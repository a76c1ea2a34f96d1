package store

import (
	"encoding/json"
	"fmt"
	"slices"
)

// The stream buffer on disk: one stream_batches row per batch of a
// streamed message's deltas (what one AppendDeltas call wrote), holding
// consecutive seqs FirstSeq..LastSeq and parts FirstPart.. in order, their
// texts a JSON array. A batch is written, read and purged whole.

// deltaBatch is one stream_batches row.
type deltaBatch struct {
	ThreadID  string `db:"thread_id"`
	FirstSeq  int64  `db:"first_seq"`
	LastSeq   int64  `db:"last_seq"`
	RunID     string `db:"run_id"`
	MessageID string `db:"message_id"`
	FirstPart int    `db:"first_part"`
	Texts     string `db:"texts"`
	TS        int64  `db:"ts"`         // the first delta's
	TSOffsets string `db:"ts_offsets"` // "" (all at TS) or a JSON array: each delta's ms after TS
}

// batchCols are the columns of a deltaBatch, in its order.
const batchCols = `thread_id, first_seq, last_seq, run_id, message_id, first_part, texts, ts, ts_offsets`

// bufferedDelta is one delta of a batch.
type bufferedDelta struct {
	ThreadID  string
	Seq       int64
	RunID     string
	MessageID string
	Part      int
	Text      string
	TS        int64
}

// deltas expands the batch. A row whose texts do not decode, or do not
// number LastSeq-FirstSeq+1, is an error: the buffer is damaged.
func (b deltaBatch) deltas() ([]bufferedDelta, error) {
	var texts []string
	if err := json.Unmarshal([]byte(b.Texts), &texts); err != nil {
		return nil, fmt.Errorf(
			"stream batch %s/%d: texts are not a JSON array of strings: %w",
			b.ThreadID, b.FirstSeq, err,
		)
	}
	if int64(len(texts)) != b.LastSeq-b.FirstSeq+1 {
		return nil, fmt.Errorf(
			"stream batch %s/%d: %d texts for seqs %d..%d",
			b.ThreadID, b.FirstSeq, len(texts), b.FirstSeq, b.LastSeq,
		)
	}
	var offsets []int64
	if b.TSOffsets != "" {
		if err := json.Unmarshal([]byte(b.TSOffsets), &offsets); err != nil || len(offsets) != len(texts) {
			return nil, fmt.Errorf(
				"stream batch %s/%d: ts_offsets %q do not give one offset per delta",
				b.ThreadID, b.FirstSeq, b.TSOffsets,
			)
		}
	}
	out := make([]bufferedDelta, len(texts))
	for i, text := range texts {
		ts := b.TS
		if offsets != nil {
			ts += offsets[i]
		}
		out[i] = bufferedDelta{ThreadID: b.ThreadID, Seq: b.FirstSeq + int64(i), RunID: b.RunID, MessageID: b.MessageID,
			Part: b.FirstPart + i, Text: text, TS: ts}
	}
	return out, nil
}

// expandBatches expands batches in order, keeping the deltas keep accepts
// (nil: all).
func expandBatches(batches []deltaBatch, keep func(bufferedDelta) bool) ([]bufferedDelta, error) {
	var out []bufferedDelta
	for _, b := range batches {
		ds, err := b.deltas()
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			if keep == nil || keep(d) {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// encodeTimes is the ts and ts_offsets columns of a batch whose deltas
// were stamped tss.
func encodeTimes(tss []int64) (int64, string, error) {
	first := tss[0]
	if !slices.ContainsFunc(tss, func(ts int64) bool { return ts != first }) {
		return first, "", nil
	}
	offsets := make([]int64, len(tss))
	for i, ts := range tss {
		offsets[i] = ts - first
	}
	b, err := json.Marshal(offsets)
	if err != nil {
		return 0, "", fmt.Errorf("encode stream batch times: %w", err)
	}
	return first, string(b), nil
}

// encodeTexts is the texts column of a batch.
func encodeTexts(texts []string) (string, error) {
	b, err := json.Marshal(texts)
	if err != nil {
		return "", fmt.Errorf("encode stream batch: %w", err)
	}
	return string(b), nil
}
