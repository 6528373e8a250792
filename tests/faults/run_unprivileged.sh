#!/bin/sh
# Runs the command as `nobody` when started as root (for tests that need permission bits to bind:
# root ignores a folder's mode), else as it is.
if [ "$(id -u)" = 0 ]; then
  if ! command -v setpriv >/dev/null; then
    echo "run_unprivileged: setpriv (util-linux) not found, cannot drop root" >&2
    exit 1
  fi
  exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
fi
exec "$@"
