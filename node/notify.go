package node

import (
	"fmt"
	"log/slog"

	"github.com/coreos/go-systemd/v22/daemon"
)

// notifyReady tells a service manager that the node serves (systemd's
// Type=notify, contrib/systemd/kylix.service): READY=1 once the mount is
// up and the admin and client sockets listen, with a STATUS= line saying
// where. Without NOTIFY_SOCKET (not started by systemd) it does nothing.
// A failure to notify is logged, never fatal: the node serves either way,
// and systemd reports the unit's start timeout itself.
func notifyReady(log *slog.Logger, dataDir, mountDir string) {
	sdNotify(log, daemon.SdNotifyReady+"\nSTATUS="+fmt.Sprintf("serving %s at %s", dataDir, mountDir))
}

// notifyStopping tells the service manager that the node is stopping
// (STOPPING=1): it commits open writes and unmounts next, bounded by
// --stop-timeout.
func notifyStopping(log *slog.Logger, mountDir string) {
	sdNotify(log, daemon.SdNotifyStopping+"\nSTATUS=stopping: committing open writes and unmounting "+mountDir)
}

func sdNotify(log *slog.Logger, state string) {
	// unsetEnvironment false: commands run inside the node (forwarded
	// through the admin socket) never notify, but the variable stays
	// visible for diagnosis.
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("could not notify the service manager (NOTIFY_SOCKET)", "err", err)
	}
}
