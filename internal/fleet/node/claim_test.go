package node

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/fleettest"
	"github.com/agentenv/agentenv/internal/fleet/store"
)

func TestNodeNameIsUnique(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	cli := fleettest.Etcd(t)
	ctx := context.Background()
	first := New(Config{Name: "t1", Advertise: "10.0.0.1:3100", Secret: "test-secret-0123456789abcdef", Etcd: cli, Log: slog.New(slog.DiscardHandler)})
	second := New(Config{Name: "t1", Advertise: "10.0.0.2:3100", Secret: "test-secret-0123456789abcdef", Etcd: cli, Log: slog.New(slog.DiscardHandler)})
	l1, _ := cli.Grant(ctx, 30)
	l2, _ := cli.Grant(ctx, 30)
	if err := first.claim(ctx, l1.ID); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	err := second.claim(ctx, l2.ID)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "10.0.0.1:3100") {
		t.Fatalf("second claim: %v; want a conflict naming the holder at 10.0.0.1:3100", err)
	}
	if err := second.Check(ctx); err == nil || !strings.Contains(err.Error(), "10.0.0.1:3100") {
		t.Fatalf("second's start-up check: %v; want a refusal naming the holder", err)
	}
	cli.Revoke(ctx, l2.ID) // the second stops: the first's record must stay
	resp, _ := cli.Get(ctx, store.NodesPrefix+"t1")
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != l1.ID {
		t.Fatalf("after the second stopped, node t1's record is %v, want the first's", resp.Kvs)
	}
	// The first's own next run (same address) takes its record over.
	again := New(Config{Name: "t1", Advertise: "10.0.0.1:3100", Secret: "test-secret-0123456789abcdef", Etcd: cli, Log: slog.New(slog.DiscardHandler)})
	l3, _ := cli.Grant(ctx, 30)
	if err := again.claim(ctx, l3.ID); err != nil {
		t.Fatalf("the same node's next run: %v", err)
	}
	cli.Revoke(ctx, l3.ID)
	l4, _ := cli.Grant(ctx, 30)
	if err := second.claim(ctx, l4.ID); err != nil {
		t.Fatalf("claim once the holder is gone: %v", err)
	}
}
