package cocoonsim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// cocoon's cloud image download limits (images/cloudimg/pull.go).
const (
	cloudimgDownloadTimeout        = 30 * time.Minute
	cloudimgMaxDownload      int64 = 20 << 30
	cloudimgProgressInterval       = 1 << 20
)

// pullCloudimg downloads a cloud image URL and stores it under the URL, as cocoon's
// images/cloudimg does: skipped when the URL's blob is present (unless force), the download
// hashed into a temp file, sniffed, then committed (converted by qemu-img when not a plain qcow2
// v3). Progress goes to stdout with carriage returns.
func (a *app) pullCloudimg(cmd *cobra.Command, store *cloudimgStore, url string, force bool) error {
	logger := a.log.with("cmd.images.pullCloudimg")
	ctx := cmd.Context()
	if !force {
		cached := false
		if err := store.db.With(ctx, func(idx *cloudimgIndex) error {
			e := idx.Images[url]
			cached = e != nil && validFile(store.dirs.blobPath(digestHex(e.ContentSum)))
			return nil
		}); err != nil {
			return err
		}
		if cached {
			return nil
		}
	}
	tmp, err := os.CreateTemp(store.dirs.tempDir(), "pull-*.img")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck
	defer tmp.Close()           //nolint:errcheck
	digest, err := download(ctx, url, tmp, cmd.OutOrStdout(), func(total int64) {
		if total > 0 {
			logger.Infof("downloading cloud image %s (%s)", url, humanSize(total))
		} else {
			logger.Infof("downloading cloud image %s", url)
		}
	})
	if err != nil {
		return err
	}
	head := make([]byte, 8)
	n, _ := tmp.ReadAt(head, 0)
	if err := sniffHead(head[:n]); err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	if err := store.commit(ctx, url, tmp.Name(), digest); err != nil {
		return err
	}
	logger.Infof("done: %s", url)
	return nil
}

// download writes url's body to dst and returns its sha256, printing progress to out every MiB.
func download(ctx context.Context, url string, dst *os.File, out io.Writer, started func(total int64)) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("create HTTP request: %w", err)
	}
	resp, err := (&http.Client{Timeout: cloudimgDownloadTimeout}).Do(req)
	if err != nil {
		return "", fmt.Errorf("http get %s: %w", url, err)
	}
	defer resp.Body.Close() //nolint:errcheck
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("http get %s: status %d %s", url, resp.StatusCode, resp.Status)
	}
	started(resp.ContentLength)
	hash := sha256.New()
	pw := &progressWriter{w: dst, total: resp.ContentLength, out: out}
	written, err := io.Copy(pw, io.TeeReader(io.LimitReader(resp.Body, cloudimgMaxDownload+1), hash))
	fmt.Fprintln(out) //nolint:errcheck // ends the progress line
	if err != nil {
		return "", fmt.Errorf("download %s: %w", url, err)
	}
	if written > cloudimgMaxDownload {
		return "", fmt.Errorf("download %s: exceeded max size (%d bytes)", url, cloudimgMaxDownload)
	}
	if err := dst.Sync(); err != nil {
		return "", fmt.Errorf("sync temp file: %w", err)
	}
	return hex.EncodeToString(hash.Sum(nil)), nil
}

// progressWriter prints "\r  <done> / <total> (<pct>%)" every MiB.
type progressWriter struct {
	w                    io.Writer
	out                  io.Writer
	total, written, last int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.written += int64(n)
	if p.written-p.last >= cloudimgProgressInterval {
		p.last = p.written
		if p.total > 0 {
			fmt.Fprintf(p.out, "\r  %s / %s (%.1f%%)", humanSize(p.written), humanSize(p.total), float64(p.written)/float64(p.total)*100) //nolint:errcheck
		} else {
			fmt.Fprintf(p.out, "\r  %s downloaded", humanSize(p.written)) //nolint:errcheck
		}
	}
	return n, err
}
