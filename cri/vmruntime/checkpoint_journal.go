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

// journalEntry is one note: the snapshot's name is the file's. A pod checkpoint has a note of its
// own besides its containers', named with podCheckpointNotePrefix, for what it writes into its
// output directory: a crash before its pod.json leaves nothing of it there either.
type journalEntry struct {
	// Archive is the temporary archive, or snapshot directory, a container's checkpoint writes.
	Archive string `json:"archive,omitempty"`
	// Outputs are the entries a pod checkpoint writes into its output directory.
	Outputs []string `json:"outputs,omitempty"`
}

// podCheckpointNotePrefix names the note of a pod checkpoint, which names no snapshot.
const podCheckpointNotePrefix = checkpointSnapshotPrefix + "pod-"

// noteCheckpoint records a checkpoint about to write archive through the snapshot name, and
// returns what removes the note.
func (s *Runtime) noteCheckpoint(name, archive string) (done func(), err error) {
	return s.note(name, journalEntry{Archive: archive})
}

// notePodCheckpoint records a pod checkpoint about to write outputs into its output directory,
// and returns what removes the note.
func (s *Runtime) notePodCheckpoint(sandboxID string, outputs []string) (done func(), err error) {
	name, err := snapshotName(podCheckpointNotePrefix, sandboxID)
	if err != nil {
		return nil, err
	}
	return s.note(name, journalEntry{Outputs: outputs})
}

func (s *Runtime) note(name string, entry journalEntry) (done func(), err error) {
	if s.cfg.CheckpointJournal == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(s.cfg.CheckpointJournal, 0o700); err != nil {
		return nil, err
	}
	data, err := json.Marshal(entry)
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
		if data, err := os.ReadFile(path); err == nil {
			_ = json.Unmarshal(data, &entry)
		}
		// An archive, the directory a pod checkpoint's container is exported into, or what a pod
		// checkpoint wrote into its output directory.
		if !s.removeAll(append([]string{entry.Archive}, entry.Outputs...)) {
			continue
		}
		if !strings.HasPrefix(name, podCheckpointNotePrefix) {
			if err := s.cocoon.SnapshotRemove(ctx, name); err != nil && !isNotFound(err) {
				s.log.Warn("cannot remove the snapshot of an interrupted checkpoint", "snapshot", name, "err", err)
				continue
			}
		}
		s.log.Info("removed what an interrupted checkpoint left", "note", name, "archive", entry.Archive, "outputs", entry.Outputs)
		_ = os.Remove(path)
	}
}

// removeAll removes what an interrupted checkpoint wrote, and says whether all of it is gone.
func (s *Runtime) removeAll(paths []string) bool {
	gone := true
	for _, p := range paths {
		if p == "" {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			s.log.Warn("cannot remove what an interrupted checkpoint wrote", "path", p, "err", err)
			gone = false
		}
	}
	return gone
}
