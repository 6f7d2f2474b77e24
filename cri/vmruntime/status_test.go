package vmruntime

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/refresh"
)

func TestStatusRefusesACocoonTooOld(t *testing.T) {
	for _, tc := range []struct {
		version string
		ready   bool
	}{
		{"v0.3.2", false},
		{"0.2.9", false},
		{"v0.3.8", true},
		{"v0.5.1", true},
		{"dev", true},
	} {
		s := testServer()
		s.health = refresh.New(time.Hour, time.Second, func(context.Context) (*cocoon.VersionInfo, error) {
			return &cocoon.VersionInfo{Version: tc.version}, nil
		})
		s.netReady = refresh.New(time.Hour, time.Second, func(context.Context) (struct{}, error) { return struct{}{}, nil })
		resp, err := s.Status(context.Background(), &runtimeapi.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		cond := resp.GetStatus().GetConditions()[0]
		if cond.GetType() != runtimeapi.RuntimeReady || cond.GetStatus() != tc.ready {
			t.Fatalf("cocoon %s: RuntimeReady %v, want %v", tc.version, cond.GetStatus(), tc.ready)
		}
		want := "cocoon " + tc.version + " is older than v0.3.8, the oldest cocoon-cri supports: upgrade cocoon"
		if !tc.ready && (cond.GetReason() != "CocoonTooOld" || cond.GetMessage() != want) {
			t.Fatalf("cocoon %s: reason %q, message %q", tc.version, cond.GetReason(), cond.GetMessage())
		}
	}
}
