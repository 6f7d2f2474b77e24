package checkpoint

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// exportArchive builds a small tar as `cocoon snapshot export` would: snapshot.json, then files.
func exportArchive(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range map[string]string{"snapshot.json": `{"version":1}`, "memory-ranges": strings.Repeat("m", 700)} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o640, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestArchiveRoundTrip(t *testing.T) {
	export := exportArchive(t)
	md := &Metadata{
		Version:   FormatVersion,
		CreatedAt: time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC),
		Pod:       Pod{Name: "web", Namespace: "default", UID: "u1", SandboxID: "s1"},
		Container: Container{Name: "app", ID: "c1", Image: "cocoon.local/app:v1"},
		// Long enough that the entry's padding is not trivial.
		Hypervisor: "cloud-hypervisor", BaseImage: strings.Repeat("b", 300),
	}
	var archive bytes.Buffer
	if err := Write(&archive, md, func(w io.Writer) error { _, err := w.Write(export); return err }); err != nil {
		t.Fatal(err)
	}
	if archive.Len()%blockSize != 0 {
		t.Fatalf("archive is %d bytes, not whole tar blocks", archive.Len())
	}

	// The whole archive is one tar stream whose first entry is the metadata.
	tr := tar.NewReader(bytes.NewReader(archive.Bytes()))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("archive is not a tar stream: %v", err)
		}
		names = append(names, hdr.Name)
	}
	if len(names) != 3 || names[0] != MetadataName {
		t.Fatalf("entries %v, want %s then the export's two", names, MetadataName)
	}

	br := bufio.NewReader(bytes.NewReader(archive.Bytes()))
	got, err := Read(br)
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Pod != md.Pod || got.Container != md.Container || got.BaseImage != md.BaseImage || !got.CreatedAt.Equal(md.CreatedAt) {
		t.Fatalf("metadata %+v, want %+v", got, md)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rest, export) {
		t.Fatal("what follows the metadata is not the export byte for byte")
	}
}

func TestReadLeavesPlainArchives(t *testing.T) {
	export := exportArchive(t)
	for name, input := range map[string][]byte{"export": export, "short": []byte("qcow"), "empty": nil} {
		br := bufio.NewReader(bytes.NewReader(input))
		md, err := Read(br)
		if err != nil || md != nil {
			t.Fatalf("%s: Read = %v, %v; want nothing", name, md, err)
		}
		rest, _ := io.ReadAll(br)
		if !bytes.Equal(rest, input) {
			t.Fatalf("%s: Read consumed bytes of an archive without metadata", name)
		}
	}
}

func TestReadRefusesBadMetadata(t *testing.T) {
	for name, body := range map[string]string{
		"not json":      "{",
		"other version": `{"version":7}`,
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Name: MetadataName, Mode: 0o600, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
		_ = tw.Close()
		if _, err := Read(bufio.NewReader(&buf)); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: Read = %v, want ErrInvalid", name, err)
		}
	}
}
