package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// bigMemory is the size of the memory file that makes the benchmark's snapshot 1 GiB.
const bigMemory = 1 << 30

// BenchmarkPullSnapshot1GiB pulls a 1 GiB snapshot from a local registry server (Debian's
// docker-registry) through imagestore into the simulator's `snapshot import`, downloads the same
// blobs with plain net/http, and imports the same archive from a file, reporting MB/s for each:
// the end-to-end pull next to its two bounds, the transfer and cocoon's import.
func BenchmarkPullSnapshot1GiB(b *testing.B) {
	if err := registry.Available(); err != nil {
		b.Skip(err)
	}
	reg := registry.Start(b, registry.Options{})
	ref := reg.Host + "/bench/snap:1g"
	archive := pushBigSnapshot(b, reg.Target(), "bench/snap:1g")
	n := newTestNode(b, PullOptions{})
	session, art := resolveRef(b, n.svc, ref)
	blobs := append([]registryBlob{{art.manifest.Config.Digest.String(), art.manifest.Config.Size}}, layerBlobs(art)...)
	var total int64
	for _, blob := range blobs {
		total += blob.size
	}
	ctx := context.Background()

	b.Run("imagestore", func(b *testing.B) {
		for b.Loop() {
			img, err := n.svc.Pull(ctx, ref, Credentials{})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := n.svc.Remove(ctx, img.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	})
	b.Run("plain-http", func(b *testing.B) {
		for b.Loop() {
			for _, blob := range blobs {
				url := fmt.Sprintf("http://%s/v2/%s/blobs/%s", reg.Host, session.repo.RepositoryStr(), blob.digest)
				resp, err := http.Get(url) //nolint:gosec,noctx // the benchmark's own registry
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != blob.size {
					b.Fatalf("blob %s: %d bytes, %v", blob.digest, n, err)
				}
			}
		}
		b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	})
	b.Run("cocoon-import", func(b *testing.B) {
		for b.Loop() {
			f, err := os.Open(archive)
			if err != nil {
				b.Fatal(err)
			}
			// A pipe, as a pull feeds cocoon, not a file cocoon could read faster.
			_, err = n.cocoon.SnapshotImport(ctx, struct{ io.Reader }{f}, "bench-import", "")
			f.Close()
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := n.cocoon.SnapshotRemove(ctx, "bench-import"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	})
}

type registryBlob struct {
	digest string
	size   int64
}

func layerBlobs(art *artifact) []registryBlob {
	var out []registryBlob
	for _, l := range art.manifest.Layers {
		out = append(out, registryBlob{l.Digest.String(), l.Size})
	}
	return out
}

// resolveRef resolves ref with the service's registry client.
func resolveRef(tb testing.TB, s *Service, ref string) (*registrySession, *artifact) {
	tb.Helper()
	parsed, err := s.registry.parse(ref)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	session, err := s.registry.connect(ctx, parsed.Context(), Credentials{})
	if err != nil {
		tb.Fatal(err)
	}
	art, err := session.resolve(ctx, parsed)
	if err != nil {
		tb.Fatal(err)
	}
	return session, art
}

// pushBigSnapshot pushes a small snapshot archive with a 1 GiB memory file added, and returns the
// archive's file.
func pushBigSnapshot(b *testing.B, target registry.Target, repoTag string) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "big.tar")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var small bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&small, testimage.SnapshotOptions{Name: "big", Memory: bigMemory}); err != nil {
		b.Fatal(err)
	}
	if err := appendMemoryFile(f, &small); err != nil {
		b.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
	if _, err := target.PushSnapshot(context.Background(), repoTag, f, registry.SnapshotPush{}); err != nil {
		b.Fatal(err)
	}
	return path
}

// appendMemoryFile copies the archive's entries to w and adds memory-range-1, bigMemory bytes that
// do not compress (nothing compresses on the way, but no layer should be special).
func appendMemoryFile(w io.Writer, archive io.Reader) error {
	tr, tw := tar.NewReader(archive), tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "memory-range-1", Mode: 0o600, Size: bigMemory}); err != nil {
		return err
	}
	chunk := make([]byte, 4<<20)
	rng := rand.NewChaCha8([32]byte{1})
	for range bigMemory / len(chunk) {
		_, _ = rng.Read(chunk)
		if _, err := tw.Write(chunk); err != nil {
			return err
		}
	}
	return tw.Close()
}
