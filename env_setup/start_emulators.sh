#!/usr/bin/env bash
# Start N headless emulators of the AVD from its snapshot, on consecutive console
# ports (5554, 5556, ...), read-only so that they share one AVD, and wait until all have booted.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

FIRST_PORT="${FIRST_PORT:-5554}"
LOG_DIR="${LOG_DIR:-/tmp/digiq-emulators}"

usage() {
    cat <<USAGE
usage: $0 N
Starts N emulators of $AVD_NAME from snapshot $SNAPSHOT (serials emulator-$FIRST_PORT, emulator-$((FIRST_PORT + 2)), ...),
headless (-no-window -no-audio -no-boot-anim -read-only); logs in $LOG_DIR. About 2.5 GB RAM and 1-2 cores each.
Verify: adb devices   (lists N emulators as "device")
Stop:   for s in \$(adb devices | awk '/^emulator-/{print \$1}'); do adb -s "\$s" emu kill; done
USAGE
}

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    usage
    exit 0
fi
if [ "$#" -ne 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    usage >&2
    exit 2
fi
n="$1"

need emulator "run env_setup/install_sdk.sh first"
need adb "run env_setup/install_sdk.sh first"
need_kvm

adb start-server
mkdir -p "$LOG_DIR"
serials=()
for ((i = 0; i < n; i++)); do
    port=$((FIRST_PORT + 2 * i))
    mapfile -t args < <(emulator_args "$port")
    emulator "${args[@]}" -read-only -snapshot "$SNAPSHOT" -no-snapshot-save >"$LOG_DIR/emulator-$port.log" 2>&1 &
    serials+=("emulator-$port")
done
for serial in "${serials[@]}"; do
    wait_for_boot "$serial"
    echo "$serial booted"
done
echo "started ${#serials[@]} emulator(s): ${serials[*]}"
