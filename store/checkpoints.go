package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// A checkpoint's three lists (message ids, completed steps, tool results)
// hold the whole conversation up to it, so they grow with it. Written
// whole, every new checkpoint of a long conversation would rewrite them:
// bytes per exchange growing with the conversation (issue 31). A
// checkpoint whose lists continue its parent's (the parent a checkpoint of
// the same thread, its lists a prefix of the new ones: a run's steps, a
// saved fragment, a continue) is stored as what it appended, with
// appended = 1; any other (a thread's first checkpoint, a fork's, a
// deleted draft) is stored whole. See ARCHITECTURE.md, "Checkpoints".
//
// Reading gives the lists whole again, by walking parents up to a row
// stored whole. chainCache keeps the walk short: checkpoints never change
// once written, so the nodes of those already read or written serve every
// later read, on any connection.

// cpNode is one checkpoint's lists as stored: whole (parent nil), or what
// it appended to parent's. Immutable once made.
type cpNode struct {
	parent *cpNode
	msgs   []string
	steps  []string
	tools  []chat.ToolResult
	// The lengths of the whole lists up to and with this node.
	nMsgs, nSteps, nTools int
}

func newNode(parent *cpNode, msgs, steps []string, tools []chat.ToolResult) *cpNode {
	n := &cpNode{parent: parent, msgs: slices.Clip(msgs), steps: slices.Clip(steps), tools: slices.Clip(tools),
		nMsgs: len(msgs), nSteps: len(steps), nTools: len(tools)}
	if parent != nil {
		n.nMsgs += parent.nMsgs
		n.nSteps += parent.nSteps
		n.nTools += parent.nTools
	}
	return n
}

// whole returns the node's lists whole, in new slices the caller owns.
func (n *cpNode) whole() (msgs, steps []string, tools []chat.ToolResult) {
	msgs, steps, tools = make([]string, n.nMsgs), make([]string, n.nSteps), make([]chat.ToolResult, n.nTools)
	m, s, t := n.nMsgs, n.nSteps, n.nTools
	for at := n; at != nil; at = at.parent {
		m -= copy(msgs[m-len(at.msgs):m], at.msgs)
		s -= copy(steps[s-len(at.steps):s], at.steps)
		t -= copy(tools[t-len(at.tools):t], at.tools)
	}
	return msgs, steps, tools
}

// prefixOf reports whether the node's whole lists are prefixes of msgs,
// steps and tools, comparing node by node without making them whole.
func (n *cpNode) prefixOf(msgs, steps []string, tools []chat.ToolResult) bool {
	if n.nMsgs > len(msgs) || n.nSteps > len(steps) || n.nTools > len(tools) {
		return false
	}
	m, s, t := n.nMsgs, n.nSteps, n.nTools
	for at := n; at != nil; at = at.parent {
		if !slices.Equal(msgs[m-len(at.msgs):m], at.msgs) || !slices.Equal(steps[s-len(at.steps):s], at.steps) ||
			!slices.Equal(tools[t-len(at.tools):t], at.tools) {
			return false
		}
		m, s, t = m-len(at.msgs), s-len(at.steps), t-len(at.tools)
	}
	return true
}

func (n *cpNode) weight() int { return len(n.msgs) + len(n.steps) + len(n.tools) + 1 }

// chainCache maps checkpoint ids to their nodes. Safe for concurrent use.
// It is bounded by the entries its nodes hold (weight); when over, it
// forgets arbitrary nodes (a node forgotten is read again from the
// database when needed; one still reachable as a parent stays in memory
// as long as its child does).
type chainCache struct {
	mu        sync.Mutex
	nodes     map[string]*cpNode
	weight    int
	maxWeight int
}

// chainCacheWeight bounds a chainCache: list entries (ids, steps, tool
// results) of the nodes it maps, about 50 bytes each.
const chainCacheWeight = 1 << 18

func newChainCache(maxWeight int) *chainCache {
	return &chainCache{nodes: map[string]*cpNode{}, maxWeight: maxWeight}
}

func (c *chainCache) get(id string) *cpNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

func (c *chainCache) put(id string, n *cpNode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.nodes[id]; ok {
		c.weight -= old.weight()
	}
	c.nodes[id] = n
	c.weight += n.weight()
	if c.weight <= c.maxWeight {
		return
	}
	for k, v := range c.nodes { // map order: arbitrary
		if c.weight <= c.maxWeight*3/4 {
			break
		}
		delete(c.nodes, k)
		c.weight -= v.weight()
	}
}

// chainPage is how many ancestors one query of chain reads.
const chainPage = 32

// chainRow is a checkpoint's lists as stored, with its place in a walk.
type chainRow struct {
	CheckpointID       string  `db:"checkpoint_id"`
	ParentCheckpointID *string `db:"parent_checkpoint_id"`
	Appended           int64   `db:"appended"`
	MessageIDs         string  `db:"message_ids"`
	CompletedSteps     string  `db:"completed_steps"`
	ToolResults        string  `db:"tool_results"`
	Depth              int64   `db:"depth"`
}

// node returns the node of checkpoint id of thread threadID, reading from
// q what the cache does not hold: the checkpoint and its ancestors up to
// one the cache holds or one stored whole, chainPage at a time. A missing
// checkpoint answers checkpoint_not_found.
func (c *chainCache) node(ctx context.Context, q *sqlx.Tx, threadID, id string) (*cpNode, error) {
	if n := c.get(id); n != nil {
		return n, nil
	}
	var walked []chainRow // from id towards the root
	var base *cpNode
	for at := id; ; {
		var page []chainRow
		err := q.SelectContext(
			ctx,
			&page,
			q.Rebind(`WITH RECURSIVE chain (checkpoint_id, parent_checkpoint_id, appended,
			message_ids, completed_steps, tool_results, depth) AS (
			SELECT checkpoint_id, parent_checkpoint_id, appended, message_ids, completed_steps, tool_results, 0
				FROM checkpoints WHERE checkpoint_id = ? AND thread_id = ?
			UNION ALL
			SELECT p.checkpoint_id, p.parent_checkpoint_id, p.appended, p.message_ids, p.completed_steps,
			p.tool_results, chain.depth + 1
				FROM chain JOIN checkpoints p ON p.checkpoint_id = chain.parent_checkpoint_id AND p.thread_id = ?
				WHERE chain.appended = 1 AND chain.depth < ?
		) SELECT checkpoint_id, parent_checkpoint_id, appended, message_ids, completed_steps, tool_results, depth
			FROM chain ORDER BY depth`),
			at,
			threadID,
			threadID,
			chainPage-1,
		)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint %s's chain: %w", at, err)
		}
		if len(page) == 0 {
			if at == id {
				return nil, checkpointNotFound(threadID, id)
			}
			return nil, fmt.Errorf(
				"checkpoint %s's lists continue %s, which is not a checkpoint of thread %s",
				walked[len(walked)-1].CheckpointID, at, threadID,
			)
		}
		walked = append(walked, page...)
		last := page[len(page)-1]
		if last.Appended == 0 {
			break
		}
		if last.ParentCheckpointID == nil {
			return nil, fmt.Errorf("checkpoint %s is stored as appended to its parent but has none", last.CheckpointID)
		}
		if base = c.get(*last.ParentCheckpointID); base != nil {
			break
		}
		if len(page) < chainPage {
			// The walk stopped early: the parent is not in the thread.
			return nil, fmt.Errorf(
				"checkpoint %s's lists continue %s, which is not a checkpoint of thread %s",
				last.CheckpointID, *last.ParentCheckpointID, threadID,
			)
		}
		at = *last.ParentCheckpointID
	}
	n := base
	for i := len(walked) - 1; i >= 0; i-- {
		r := walked[i]
		var cp chat.Checkpoint
		if err := decodeLists(r.CheckpointID, r.MessageIDs, r.CompletedSteps, r.ToolResults, &cp); err != nil {
			return nil, err
		}
		if r.Appended == 0 {
			n = nil
		}
		n = newNode(n, cp.MessageIDs, cp.CompletedSteps, cp.ToolResults)
		c.put(r.CheckpointID, n)
	}
	return n, nil
}

// loadCheckpoint loads a checkpoint of the given thread with its lists
// whole; one of another thread answers checkpoint_not_found.
func loadCheckpoint(
	ctx context.Context,
	q *sqlx.Tx,
	cache *chainCache,
	threadID, checkpointID string,
) (chat.Checkpoint, error) {
	var row checkpointRow
	err := q.GetContext(
		ctx, &row,
		q.Rebind(`SELECT `+checkpointCols+` FROM checkpoints WHERE checkpoint_id = ? AND thread_id = ?`),
		checkpointID, threadID,
	)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return chat.Checkpoint{}, checkpointNotFound(threadID, checkpointID)
		}
		return chat.Checkpoint{}, fmt.Errorf("load checkpoint: %w", err)
	}
	return wholeCheckpoint(ctx, q, cache, row)
}

// wholeCheckpoint decodes row with its lists whole.
func wholeCheckpoint(ctx context.Context, q *sqlx.Tx, cache *chainCache, row checkpointRow) (chat.Checkpoint, error) {
	cp, err := row.checkpoint()
	if err != nil || row.Appended == 0 {
		return cp, err
	}
	n := cache.get(row.CheckpointID)
	if n == nil {
		parent, err := cache.node(ctx, q, row.ThreadID, *cp.ParentCheckpointID)
		if err != nil {
			return cp, err
		}
		n = newNode(parent, cp.MessageIDs, cp.CompletedSteps, cp.ToolResults)
		cache.put(row.CheckpointID, n)
	}
	cp.MessageIDs, cp.CompletedSteps, cp.ToolResults = n.whole()
	return cp, nil
}

// decodedCheckpoint is a row of chainNodes: the checkpoint with its lists
// as stored, and its node (nil when err says why it could not be read).
type decodedCheckpoint struct {
	row  *checkpointRow
	cp   chat.Checkpoint // its lists as stored
	node *cpNode
	err  error
	done bool
}

// chainNodes decodes rows, every checkpoint of some threads, and gives
// each its node: an appended row continues its parent among rows. A row
// that cannot be decoded, or whose parent is not among rows of its
// thread, has err set. byID maps the rows' checkpoint ids.
func chainNodes(rows []checkpointRow) (all []*decodedCheckpoint, byID map[string]*decodedCheckpoint) {
	byID = make(map[string]*decodedCheckpoint, len(rows))
	all = make([]*decodedCheckpoint, len(rows))
	for i := range rows {
		d := &decodedCheckpoint{row: &rows[i]}
		d.cp, d.err = rows[i].checkpoint()
		d.done = d.err != nil
		byID[rows[i].CheckpointID] = d
		all[i] = d
	}
	var resolve func(d *decodedCheckpoint, depth int) (*cpNode, error)
	resolve = func(d *decodedCheckpoint, depth int) (*cpNode, error) {
		if d.done {
			return d.node, d.err
		}
		r := d.row
		var parent *cpNode
		if r.Appended == 1 {
			switch p, ok := byID[r.ParentCheckpointID.String]; {
			case !r.ParentCheckpointID.Valid:
				d.err = fmt.Errorf("checkpoint %s is stored as appended to its parent but has none", r.CheckpointID)
			case !ok || p.row.ThreadID != r.ThreadID || depth > len(rows):
				d.err = fmt.Errorf(
					"checkpoint %s's lists continue %s, which is not a checkpoint of thread %s",
					r.CheckpointID, r.ParentCheckpointID.String, r.ThreadID,
				)
			default:
				var err error
				if parent, err = resolve(p, depth+1); err != nil {
					d.err = fmt.Errorf("checkpoint %s continues %s: %w", r.CheckpointID, p.row.CheckpointID, err)
				}
			}
		}
		if d.err == nil {
			d.node = newNode(parent, d.cp.MessageIDs, d.cp.CompletedSteps, d.cp.ToolResults)
		}
		d.done = true
		return d.node, d.err
	}
	for _, d := range all {
		_, _ = resolve(d, 0) // (the error stays in d.err)
	}
	return all, byID
}

// wholeCheckpoints decodes rows, every checkpoint of some threads, with
// their lists whole: an appended row continues its parent among rows. A
// row that cannot be decoded, or whose parent is not among rows of its
// thread, is left out and gives an error in errs.
func wholeCheckpoints(rows []checkpointRow) (out []chat.Checkpoint, errs []error) {
	all, _ := chainNodes(rows)
	for _, d := range all {
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		cp := d.cp
		cp.MessageIDs, cp.CompletedSteps, cp.ToolResults = d.node.whole()
		out = append(out, cp)
	}
	return out, errs
}

// deltaCheckpoints decodes rows, every checkpoint of one thread oldest
// first, with their lists told as what they change from the parent's
// (chat.CheckpointDelta): an appended row as stored; a row stored whole
// (a deleted draft's) as the longest start it shares with its parent's
// lists and the rest. Memory and answer grow with the entries stored, not
// with the lists made whole. Errors as for wholeCheckpoints.
func deltaCheckpoints(rows []checkpointRow) (out []chat.CheckpointDelta, errs []error) {
	all, byID := chainNodes(rows)
	out = make([]chat.CheckpointDelta, 0, len(all))
	for _, d := range all {
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		c, n := d.cp, d.node
		out = append(out, chat.CheckpointDelta{
			CheckpointID: c.CheckpointID, ThreadID: c.ThreadID, ParentCheckpointID: c.ParentCheckpointID,
			StateVersion: c.StateVersion, Pending: c.Pending, RunID: c.RunID, CreatedAt: c.CreatedAt,
		})
		o := &out[len(out)-1]
		var parent *decodedCheckpoint
		if c.ParentCheckpointID != nil {
			if p, ok := byID[*c.ParentCheckpointID]; ok && p.err == nil && p.row.ThreadID == c.ThreadID {
				parent = p
			}
		}
		switch {
		case n.parent != nil:
			// Stored as appended: it keeps its parent's lists whole.
			o.MessageIDsKept, o.CompletedStepsKept, o.ToolResultsKept = n.parent.nMsgs, n.parent.nSteps, n.parent.nTools
			o.MessageIDsAdded, o.CompletedStepsAdded, o.ToolResultsAdded = n.msgs, n.steps, n.tools
		case parent != nil:
			pm, ps, pt := parent.node.whole()
			o.MessageIDsKept = commonPrefix(pm, n.msgs)
			o.CompletedStepsKept = commonPrefix(ps, n.steps)
			o.ToolResultsKept = commonPrefix(pt, n.tools)
			o.MessageIDsAdded = n.msgs[o.MessageIDsKept:]
			o.CompletedStepsAdded = n.steps[o.CompletedStepsKept:]
			o.ToolResultsAdded = n.tools[o.ToolResultsKept:]
		default:
			o.MessageIDsAdded, o.CompletedStepsAdded, o.ToolResultsAdded = n.msgs, n.steps, n.tools
		}
		// (Empty lists are [] on the wire, as in the whole form.)
		o.MessageIDsAdded = nonNil(o.MessageIDsAdded)
		o.CompletedStepsAdded = nonNil(o.CompletedStepsAdded)
		o.ToolResultsAdded = nonNil(o.ToolResultsAdded)
	}
	return out, errs
}

// commonPrefix is how many first entries a and b share.
func commonPrefix[T comparable](a, b []T) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// checkpointNotFound is the answer for a checkpoint that is not one of
// the thread's.
func checkpointNotFound(threadID, checkpointID string) error {
	return chat.Errorf(
		chat.CodeCheckpointNotFound,
		"no checkpoint %q in thread %s: reload the thread and pick one of its checkpoints",
		checkpointID, threadID,
	)
}

// storedLists is what addCheckpoint writes of cp's lists: what they append
// to the parent's (appended true) when the parent is a checkpoint of the
// thread whose lists are a prefix of cp's, else the lists whole. node is
// cp's node for the cache.
func (t *txn) storedLists(
	cp chat.Checkpoint,
) (msgs, steps []string, tools []chat.ToolResult, appended bool, node *cpNode, err error) {
	if cp.ParentCheckpointID != nil {
		parent, err := t.cps.node(t.ctx, t.tx, cp.ThreadID, *cp.ParentCheckpointID)
		if err != nil && chat.ErrorCode(err) != chat.CodeCheckpointNotFound {
			return nil, nil, nil, false, nil, err
		}
		if parent != nil && parent.prefixOf(cp.MessageIDs, cp.CompletedSteps, cp.ToolResults) {
			msgs, steps, tools = cp.MessageIDs[parent.nMsgs:], cp.CompletedSteps[parent.nSteps:],
				cp.ToolResults[parent.nTools:]
			msgs, steps, tools = slices.Clone(msgs), slices.Clone(steps), slices.Clone(tools)
			return msgs, steps, tools, true, newNode(parent, msgs, steps, tools), nil
		}
	}
	msgs, steps, tools = slices.Clone(cp.MessageIDs), slices.Clone(cp.CompletedSteps), slices.Clone(cp.ToolResults)
	return msgs, steps, tools, false, newNode(nil, msgs, steps, tools), nil
}

// listJSON is a stored list: [] for none, never null.
func listJSON[T any](list []T) string {
	if list == nil {
		list = []T{}
	}
	return mustJSON(list)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
