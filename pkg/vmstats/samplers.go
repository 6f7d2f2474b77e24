package vmstats

import "sync"

// Samplers keeps, for each key (a container), its hypervisor's files open between samples
// (ProcessFiles). It is safe for concurrent use: samples of different keys run in parallel.
type Samplers struct {
	mu    sync.Mutex
	files map[string]*sampler
}

// sampler is one key's files of process pid; mu keeps their buffer to one sample at a time.
type sampler struct {
	pid   int
	mu    sync.Mutex
	files *ProcessFiles // nil once closed
}

// Sample samples process pid for key, through the files of an earlier sample of the same PID
// when there are some. Files that fail a sample (their process is gone) are closed.
func (s *Samplers) Sample(procRoot, key string, pid int) (*Process, error) {
	var p *Process
	err := s.with(procRoot, key, pid, func(f *ProcessFiles) (err error) {
		p, err = f.Sample()
		return err
	})
	return p, err
}

// NetDev reads the interfaces of process pid's network namespace for key, as Sample does.
func (s *Samplers) NetDev(procRoot, key string, pid int) ([]Interface, error) {
	var ifaces []Interface
	err := s.with(procRoot, key, pid, func(f *ProcessFiles) (err error) {
		ifaces, err = f.NetDev()
		return err
	})
	return ifaces, err
}

func (s *Samplers) with(procRoot, key string, pid int, read func(*ProcessFiles) error) error {
	e, err := s.entry(procRoot, key, pid)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.files == nil {
		// Closed meanwhile: the process went, or the key was forgotten.
		return ErrGone
	}
	if err := read(e.files); err != nil {
		s.mu.Lock()
		if s.files[key] == e {
			delete(s.files, key)
		}
		s.mu.Unlock()
		e.close()
		return err
	}
	return nil
}

// entry is key's sampler for pid, opened if it has none or one of another PID.
func (s *Samplers) entry(procRoot, key string, pid int) (*sampler, error) {
	s.mu.Lock()
	e, stale := s.files[key], (*sampler)(nil)
	if e != nil && e.pid != pid {
		stale, e = e, nil
		delete(s.files, key)
	}
	var err error
	if e == nil {
		var f *ProcessFiles
		if f, err = OpenProcess(procRoot, pid); err == nil {
			if s.files == nil {
				s.files = map[string]*sampler{}
			}
			e = &sampler{pid: pid, files: f}
			s.files[key] = e
		}
	}
	s.mu.Unlock()
	if stale != nil {
		stale.closeLocked()
	}
	return e, err
}

// Close closes key's files, if it has some: a VM that exited leaves its network namespace, which
// its open net/dev file holds, at once.
func (s *Samplers) Close(key string) {
	s.mu.Lock()
	e := s.files[key]
	delete(s.files, key)
	s.mu.Unlock()
	if e != nil {
		e.closeLocked()
	}
}

// Forget closes the files of keys keep rejects.
func (s *Samplers) Forget(keep func(key string) bool) {
	s.mu.Lock()
	var gone []*sampler
	for k, e := range s.files {
		if !keep(k) {
			gone = append(gone, e)
			delete(s.files, k)
		}
	}
	s.mu.Unlock()
	for _, e := range gone {
		e.closeLocked()
	}
}

// Len is the number of keys with files open.
func (s *Samplers) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.files)
}

// closeLocked closes e's files once its sample in flight, if any, is done.
func (e *sampler) closeLocked() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.close()
}

// close closes e's files; the caller holds e.mu.
func (e *sampler) close() {
	if e.files != nil {
		_ = e.files.Close()
		e.files = nil
	}
}
