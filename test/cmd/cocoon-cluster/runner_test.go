package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestRunnerUndoesItsWorkLastFirst(t *testing.T) {
	cases := []struct {
		name     string
		work     func(r *runner, order *[]string)
		wantCode int
		wantLog  string
	}{
		{"returns", func(r *runner, order *[]string) {}, 0, ""},
		{"fatal", func(r *runner, order *[]string) {
			r.Fatalf("no %s", "etcd")
			*order = append(*order, "after Fatalf")
		}, 1, "error: no etcd"},
		{"panics", func(r *runner, order *[]string) { panic("boom") }, 1, "error: panic: boom"},
		{"a cleanup fails", func(r *runner, order *[]string) {
			r.Cleanup(func() { r.Errorf("remove the fabric") })
		}, 1, "error: remove the fabric"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			r := newRunner(&log)
			var order []string
			code := r.run(func() {
				r.Cleanup(func() { order = append(order, "first") })
				r.Cleanup(func() { order = append(order, "second") })
				tc.work(r, &order)
			})
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d; log:\n%s", code, tc.wantCode, log.String())
			}
			if want := []string{"second", "first"}; !slices.Equal(order, want) {
				t.Errorf("ran %v, want %v", order, want)
			}
			if !strings.Contains(log.String(), tc.wantLog) {
				t.Errorf("log %q, want %q", log.String(), tc.wantLog)
			}
		})
	}
}

func TestRunnerTempDirGoesWithTheCleanups(t *testing.T) {
	r := newRunner(&bytes.Buffer{})
	var dir string
	if code := r.run(func() { dir = r.TempDir() }); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if err := check(dir, 1, nil); err == nil {
		t.Fatalf("%s is still there", dir)
	}
}

func TestCheckRefusesBadArguments(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		dir   string
		nodes int
		args  []string
		want  string
	}{
		{"", 1, nil, "--dir is required"},
		{dir + "/absent", 1, nil, "not a directory"},
		{dir, 0, nil, "1 to 3 nodes"},
		{dir, 4, nil, "1 to 3 nodes"},
		{dir, 1, []string{"up"}, "unexpected arguments"},
	} {
		if err := check(tc.dir, tc.nodes, tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check(%q, %d, %q) = %v, want %q", tc.dir, tc.nodes, tc.args, err, tc.want)
		}
	}
	if err := check(dir, 2, nil); err != nil {
		t.Errorf("check(%q, 2) = %v", dir, err)
	}
}
