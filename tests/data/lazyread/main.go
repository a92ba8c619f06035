// lazyread: the job of tests/test_lazy_pull.py's killed-snapshotter test, run inside the tiny
// image (which has no shell). It opens FILE, reads its first 64 KiB, says so by creating
// DIR/started, waits for DIR/go, then reads the rest and prints the whole file's sha256. The
// pause makes "the snapshotter dies while the job is halfway through a lazily fetched file"
// happen every time, not by luck of timing. A read error is printed and exits 1: what a job sees.
// Built static (CGO_ENABLED=0) by the test with Debian's Go, which build-daemon.sh needs anyway.
package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: lazyread FILE DIR")
		os.Exit(2)
	}
	file, dir := os.Args[1], os.Args[2]
	f, err := os.Open(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lazyread: %v\n", err)
		os.Exit(1)
	}
	sum := sha256.New()
	if _, err := io.CopyN(sum, f, 64<<10); err != nil {
		fmt.Fprintf(os.Stderr, "lazyread: first read: %v\n", err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "started"), nil, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "lazyread: %v\n", err)
		os.Exit(1)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	n, err := io.Copy(sum, f)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lazyread: read after %d more bytes: %v\n", n, err)
		os.Exit(1)
	}
	fmt.Printf("sha256:%x\n", sum.Sum(nil))
}
