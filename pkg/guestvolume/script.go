package guestvolume

import (
	"fmt"
	"strings"
)

// Exit codes of an update script, besides its commands' own.
const (
	// ExitLost: the guest is without the copy the update was meant for (the guest rebooted, its
	// /run is new): the caller sends a full update.
	ExitLost = 97
	// ExitIncomplete: the tar stream ended before its last entry, and nothing of it was applied:
	// the caller scans the volume again and sends a new update.
	ExitIncomplete = 98
)

// Volume is where a copy lives in the guest and where the container sees it.
type Volume struct {
	// DataDir is the copy's directory in the guest, under its /run (a tmpfs: a Secret stays in
	// memory). Its sibling DataDir+".stage" receives the tar stream, DataDir+".mounted" says the
	// bind mount is made.
	DataDir string
	// Target is the container path: DataDir (or, for a single file, DataDir/data) is bound there.
	Target   string
	ReadOnly bool
	// Once: copied when the container starts and left to the guest afterwards: a writable volume,
	// whose guest writes an update from the host would undo.
	Once bool
}

// Script is the shell script that applies u, read as a tar stream on stdin (WriteTar), to the
// guest's copy of v, and binds it at the target the first time. It needs sh, tar, cp, find,
// xargs, mv -T, readlink -f and mount -o bind, which GNU and busybox userlands both have.
func (u Update) Script(v Volume, file bool) string {
	var b strings.Builder
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	fmt.Fprintf(&b, "set -e\nd=%s\ns=%s\nt=%s\n", q(v.DataDir), q(v.DataDir+".stage"), q(v.Target))
	switch {
	case v.Once:
		b.WriteString("[ -e \"$d.mounted\" ] && exit 0\n")
	case !u.Full:
		fmt.Fprintf(&b, "[ -e \"$d.mounted\" ] || exit %d\n", ExitLost)
	}
	b.WriteString("rm -rf \"$s\"\nmkdir -p \"$d\" \"$s\"\ntar -xf - -C \"$s\"\n")
	fmt.Fprintf(&b, "[ -e \"$s/%s\" ] || { rm -rf \"$s\"; exit %d; }\ncd \"$d\"\n", stageComplete, ExitIncomplete)
	if u.Full && !file {
		// What the guest has and the tree lacks, or has as another kind, goes first.
		b.WriteString(`find . -mindepth 1 -depth | while IFS= read -r p; do
if [ -L "$s/` + stageLinks + `/$p" ]; then [ -L "$p" ] || rm -rf -- "$p"
elif [ -d "$s/` + stageFiles + `/$p" ]; then { [ -d "$p" ] && [ ! -L "$p" ]; } || rm -rf -- "$p"
elif [ -f "$s/` + stageFiles + `/$p" ]; then { [ -f "$p" ] && [ ! -L "$p" ]; } || rm -rf -- "$p"
else rm -rf -- "$p"; fi
done
`)
	}
	fmt.Fprintf(&b, "[ -s \"$s/%s\" ] && xargs -0 rm -rf -- < \"$s/%s\"\n", stageReplace, stageReplace)
	fmt.Fprintf(&b, "cp -a \"$s/%s/.\" \"$d/\"\n", stageFiles)
	// A rename replaces a link in one step: a ConfigMap's ..data switches at once.
	fmt.Fprintf(&b, "(cd \"$s/%s\" && find . -type l -exec sh -c 'for f; do mv -fT \"$f\" \"$0/$f\"; done' \"$d\" {} +)\n", stageLinks)
	fmt.Fprintf(&b, "[ -s \"$s/%s\" ] && xargs -0 rm -rf -- < \"$s/%s\"\n", stageRemove, stageRemove)
	b.WriteString("cd /\nrm -rf \"$s\"\n[ -e \"$d.mounted\" ] && exit 0\n")
	src := `"$d"`
	if file {
		src = `"$d/` + FileName + `"`
		b.WriteString("mkdir -p \"$(dirname \"$t\")\"\n[ -e \"$t\" ] || : > \"$t\"\n")
	} else {
		b.WriteString("mkdir -p \"$t\"\n")
	}
	// busybox's remount looks the target up in /proc/mounts by name, where links are resolved: a
	// token under /var/run (a link to /run) would not be found.
	b.WriteString("t=$(readlink -f \"$t\")\n")
	fmt.Fprintf(&b, "mount -o bind %s \"$t\"\n", src)
	if v.ReadOnly {
		b.WriteString("mount -o remount,bind,ro \"$t\"\n")
	}
	b.WriteString(": > \"$d.mounted\"\n")
	return b.String()
}
