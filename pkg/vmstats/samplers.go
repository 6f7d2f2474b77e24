package vmstats

import "sync"

// Samplers keeps, for each key (a container), its hypervisor's files open between samples
// (ProcessFiles). It is safe for concurrent use.
type Samplers struct {
	mu    sync.Mutex
	files map[string]*ProcessFiles
}

// Sample samples process pid for key, through the files of an earlier sample of the same PID
// when there are some. Files that fail a sample (their process is gone) are closed.
func (s *Samplers) Sample(procRoot, key string, pid int) (*Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.files[key]
	if f != nil && f.PID() != pid {
		s.drop(key)
		f = nil
	}
	if f == nil {
		var err error
		if f, err = OpenProcess(procRoot, pid); err != nil {
			return nil, err
		}
		if s.files == nil {
			s.files = map[string]*ProcessFiles{}
		}
		s.files[key] = f
	}
	p, err := f.Sample()
	if err != nil {
		s.drop(key)
	}
	return p, err
}

// Close closes key's files, if it has some.
func (s *Samplers) Close(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files[key] != nil {
		s.drop(key)
	}
}

// Forget closes the files of keys keep rejects.
func (s *Samplers) Forget(keep func(key string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.files {
		if !keep(k) {
			s.drop(k)
		}
	}
}

// Len is the number of keys with files open.
func (s *Samplers) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.files)
}

// drop closes key's files. The caller holds s.mu.
func (s *Samplers) drop(key string) {
	_ = s.files[key].Close()
	delete(s.files, key)
}
