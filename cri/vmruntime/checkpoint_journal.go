package vmruntime

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A checkpoint in progress is noted in the journal before its archive or snapshot exists, and the
// note is removed once both are settled. A note found at start belongs to a checkpoint that a
// crash cut short, whose RPC never answered: its partial archive and its snapshot are removed.

// journalEntry is one note: the snapshot's name is the file's.
type journalEntry struct {
	Archive string `json:"archive"`
}

// noteCheckpoint records a checkpoint about to write archive through the snapshot name, and
// returns what removes the note.
func (s *Runtime) noteCheckpoint(name, archive string) (done func(), err error) {
	if s.cfg.CheckpointJournal == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(s.cfg.CheckpointJournal, 0o700); err != nil {
		return nil, err
	}
	data, err := json.Marshal(journalEntry{Archive: archive})
	if err != nil {
		return nil, err
	}
	path := filepath.Join(s.cfg.CheckpointJournal, name+".json")
	if err := writeFileSynced(path, data); err != nil {
		return nil, err
	}
	return func() {
		if err := os.Remove(path); err != nil {
			s.log.Warn("could not remove a checkpoint's journal note; the next start does", "note", path, "err", err)
		}
	}, nil
}

// removeCutShortCheckpoints removes the partial archives and snapshots of checkpoints a crash cut
// short. A note whose removal fails stays for the next start.
func (s *Runtime) removeCutShortCheckpoints(ctx context.Context) {
	if s.cfg.CheckpointJournal == "" {
		return
	}
	entries, err := os.ReadDir(s.cfg.CheckpointJournal)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("cannot read the checkpoint journal", "dir", s.cfg.CheckpointJournal, "err", err)
		}
		return
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !strings.HasPrefix(name, checkpointSnapshotPrefix) {
			continue
		}
		path := filepath.Join(s.cfg.CheckpointJournal, e.Name())
		var entry journalEntry
		if data, err := os.ReadFile(path); err == nil && json.Unmarshal(data, &entry) == nil && entry.Archive != "" {
			// An archive, or the directory a pod checkpoint's container is exported into.
			if err := os.RemoveAll(entry.Archive); err != nil {
				s.log.Warn("cannot remove the partial archive of an interrupted checkpoint", "archive", entry.Archive, "err", err)
				continue
			}
		}
		if err := s.cocoon.SnapshotRemove(ctx, name); err != nil && !isNotFound(err) {
			s.log.Warn("cannot remove the snapshot of an interrupted checkpoint", "snapshot", name, "err", err)
			continue
		}
		s.log.Info("removed what an interrupted checkpoint left", "snapshot", name, "archive", entry.Archive)
		_ = os.Remove(path)
	}
}
