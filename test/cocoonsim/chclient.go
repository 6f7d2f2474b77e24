package cocoonsim

import (
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"

	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"
)

// The cloud-hypervisor REST client cocoon uses (hypervisor/cloudhypervisor/helper.go and
// utils/http.go): PUT actions expect 204, transient failures (connection errors, 5xx, 429) are
// retried three times with exponential backoff.
const (
	chHTTPTimeout   = 30 * time.Second
	chMaxRetries    = 3
	chBaseBackoff   = 100 * time.Millisecond
	chMemTransferTO = 10 * time.Minute
)

// chAPIError carries the HTTP status of a failed API call.
type chAPIError struct {
	Code    int
	Message string
}

func (e *chAPIError) Error() string { return e.Message }

// chClient talks to a hypervisor's REST API on its unix socket: cloud-hypervisor's under
// /api/v1/, or Firecracker's at the root (newFCClient).
type chClient struct {
	hc     *http.Client
	prefix string
}

func newCHClient(socketPath string) *chClient {
	return &chClient{prefix: "/api/v1/", hc: &http.Client{
		Timeout: chHTTPTimeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		}},
	}}
}

func (c *chClient) do(ctx context.Context, method, endpoint string, body []byte, want int) ([]byte, error) {
	url := "http://localhost" + c.prefix + endpoint
	var reqBody io.Reader
	if body != nil {
		reqBody = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, reqBody)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close() //nolint:errcheck
	rb, readErr := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return nil, &chAPIError{Code: resp.StatusCode, Message: fmt.Sprintf("%s %s → %d: %s", method, url, resp.StatusCode, rb)}
	}
	if readErr != nil {
		return nil, fmt.Errorf("read response body %s %s: %w", method, url, readErr)
	}
	return rb, nil
}

// action PUTs an action endpoint with retries; extra success codes are accepted too.
func (c *chClient) action(ctx context.Context, endpoint string, body any, success ...int) error {
	return c.send(ctx, http.MethodPut, endpoint, body, success...)
}

// send makes a request with retries on transient failures; extra success codes are accepted too.
func (c *chClient) send(ctx context.Context, method, endpoint string, body any, success ...int) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return fmt.Errorf("marshal %s request: %w", endpoint, err)
		}
	}
	if len(success) == 0 {
		success = []int{http.StatusNoContent}
	}
	var lastErr error
	for attempt := 0; attempt <= chMaxRetries; attempt++ {
		_, err := c.do(ctx, method, endpoint, payload, success[0])
		var apiErr *chAPIError
		if err == nil || (errors.As(err, &apiErr) && slices.Contains(success[1:], apiErr.Code)) {
			return nil
		}
		lastErr = err
		if errors.As(err, &apiErr) && apiErr.Code < 500 && apiErr.Code != http.StatusTooManyRequests {
			return err
		}
		if attempt < chMaxRetries {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(chBaseBackoff << attempt):
			}
		}
	}
	return lastErr
}

func (c *chClient) shutdown(ctx context.Context) error { return c.action(ctx, "vm.shutdown", nil) }
func (c *chClient) powerButton(ctx context.Context) error {
	return c.action(ctx, "vm.power-button", nil)
}
func (c *chClient) pause(ctx context.Context) error  { return c.action(ctx, "vm.pause", nil) }
func (c *chClient) resume(ctx context.Context) error { return c.action(ctx, "vm.resume", nil) }

// snapshot and restore move the whole guest memory, so they get the long timeout and no retry.
func (c *chClient) snapshot(ctx context.Context, destDir string) error {
	return c.memoryTransfer(ctx, "vm.snapshot", map[string]string{"destination_url": "file://" + destDir})
}

func (c *chClient) restore(ctx context.Context, sourceDir string, onDemand bool) error {
	req := struct {
		SourceURL         string `json:"source_url"`
		MemoryRestoreMode string `json:"memory_restore_mode,omitempty"`
	}{SourceURL: "file://" + sourceDir}
	if onDemand {
		req.MemoryRestoreMode = "OnDemand"
	}
	return c.memoryTransfer(ctx, "vm.restore", req)
}

func (c *chClient) memoryTransfer(ctx context.Context, endpoint string, req any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("marshal %s request: %w", endpoint, err)
	}
	c.hc.Timeout = chMemTransferTO
	defer func() { c.hc.Timeout = chHTTPTimeout }()
	_, err = c.do(ctx, http.MethodPut, endpoint, body, http.StatusNoContent)
	return err
}

func (c *chClient) addDisk(ctx context.Context, disk any) error {
	return c.action(ctx, "vm.add-disk", disk, http.StatusOK, http.StatusNoContent)
}

func (c *chClient) addNet(ctx context.Context, n any) error {
	return c.action(ctx, "vm.add-net", n, http.StatusOK, http.StatusNoContent)
}

// addDevice passes a PCI device through and returns the ID cloud-hypervisor gave it. It is sent
// once, as cocoon does: a retry after a lost answer would find the ID taken.
func (c *chClient) addDevice(ctx context.Context, dev guest.Device) (string, error) {
	payload, err := json.Marshal(dev)
	if err != nil {
		return "", fmt.Errorf("marshal vm.add-device request: %w", err)
	}
	body, err := c.do(ctx, http.MethodPut, "vm.add-device", payload, http.StatusOK)
	if err != nil {
		return "", err
	}
	var info struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return "", fmt.Errorf("decode vm.add-device answer: %w", err)
	}
	return info.ID, nil
}

// addFs hot-adds a vhost-user-fs device and returns the ID cloud-hypervisor gave it (empty when
// it answered 204). Sent once, as cocoon does: vm.add-fs is not idempotent.
func (c *chClient) addFs(ctx context.Context, f guest.Fs) (string, error) {
	payload, err := json.Marshal(f)
	if err != nil {
		return "", fmt.Errorf("marshal vm.add-fs request: %w", err)
	}
	body, err := c.do(ctx, http.MethodPut, "vm.add-fs", payload, http.StatusOK)
	var apiErr *chAPIError
	if errors.As(err, &apiErr) && apiErr.Code == http.StatusNoContent {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var info struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return "", fmt.Errorf("decode vm.add-fs answer: %w", err)
	}
	return info.ID, nil
}

func (c *chClient) removeDevice(ctx context.Context, id string) error {
	return c.action(ctx, "vm.remove-device", map[string]string{"id": id})
}

// waitForSocket waits until the API socket accepts connections, failing early if the
// hypervisor process dies first.
func waitForSocket(ctx context.Context, socketPath string, pid int, timeout time.Duration, processName string) error {
	return waitFor(ctx, timeout, time.Millisecond, func() (bool, error) {
		if conn, err := net.DialTimeout("unix", socketPath, 2*time.Second); err == nil {
			_ = conn.Close()
			return true, nil
		}
		if !isProcessAlive(pid) {
			return false, fmt.Errorf("%s exited before socket was ready", processName)
		}
		return false, nil
	})
}
