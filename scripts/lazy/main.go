// stargz-grpc: a minimal stargz snapshotter daemon for this project's lazy-pull tests and
// benchmark (issue 54). Debian 12 packages the stargz snapshotter's Go library
// (golang-github-containerd-stargz-snapshotter-dev 0.12) but not its daemon, so this file is
// our own small main over that library's service package: it reads the snapshotter's TOML
// config, builds the snapshotter and serves it on a unix socket as a containerd proxy plugin.
// Built by scripts/lazy/build-daemon.sh; no third-party source lives in this repository.
package main

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/BurntSushi/toml"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/stargz-snapshotter/service"
	"google.golang.org/grpc"
)

func main() {
	address := flag.String("address", "/run/team-dl-stargz/stargz.sock", "unix socket to serve on")
	root := flag.String("root", "/var/lib/team-dl-stargz", "snapshotter state (snapshots, fetched chunks)")
	configPath := flag.String("config", "", "stargz snapshotter TOML config (empty: defaults)")
	flag.Parse()
	ctx := log.WithLogger(context.Background(), log.L)

	var config service.Config
	if *configPath != "" {
		if _, err := toml.DecodeFile(*configPath, &config); err != nil {
			log.G(ctx).WithError(err).Fatalf("cannot read config %s", *configPath)
		}
	}
	if err := service.Supported(*root); err != nil {
		log.G(ctx).WithError(err).Fatalf("overlayfs is not usable under %s", *root)
	}
	sn, err := service.NewStargzSnapshotterService(ctx, *root, &config)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("cannot start the stargz snapshotter")
	}

	if err := os.MkdirAll(filepath.Dir(*address), 0o700); err != nil {
		log.G(ctx).WithError(err).Fatal("cannot create the socket's directory")
	}
	_ = os.Remove(*address) // a socket left by a killed daemon would block Listen
	listener, err := net.Listen("unix", *address)
	if err != nil {
		log.G(ctx).WithError(err).Fatalf("cannot listen on %s", *address)
	}
	server := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(server, snapshotservice.FromSnapshotter(sn))

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-signals
		log.G(ctx).Info("stopping: unmounting the lazy layers")
		server.Stop()
	}()
	log.G(ctx).Infof("stargz snapshotter serving on %s (root %s)", *address, *root)
	if err := server.Serve(listener); err != nil {
		log.G(ctx).WithError(err).Error("serve failed")
	}
	// Close unmounts the FUSE layers, so a stopped daemon leaves no dead mounts behind.
	if err := sn.Close(); err != nil {
		log.G(ctx).WithError(err).Error("close failed")
		os.Exit(1)
	}
}
