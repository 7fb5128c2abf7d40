#!/usr/bin/env bash
# Boot the AVD headless once, get past the first-run screens, and save the snapshot
# every episode starts from (the home screen, animations off).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

PORT="${PORT:-5554}"
SERIAL="emulator-$PORT"

usage() {
    cat <<USAGE
usage: $0 [-h]
Boots $AVD_NAME on console port $PORT (serial $SERIAL), waits for sys.boot_completed,
dismisses first-run screens, saves snapshot $SNAPSHOT (set SNAPSHOT to change it), stops the emulator.
Verify: ls \${ANDROID_AVD_HOME:-~/.android/avd}/$AVD_NAME.avd/snapshots/   (lists $SNAPSHOT)
USAGE
}

help_or_no_args "$@"

need emulator "run env_setup/install_sdk.sh first"
need adb "run env_setup/install_sdk.sh first"
need_kvm

adb start-server
mapfile -t args < <(emulator_args "$PORT")
emulator "${args[@]}" -no-snapshot-load >"/tmp/$SERIAL.log" 2>&1 &
trap 'adb -s "$SERIAL" emu kill >/dev/null 2>&1 || true' EXIT
wait_for_boot "$SERIAL"

sh_() { adb -s "$SERIAL" shell "$@"; }
# No animations: faster, and screenshots never catch a transition half way.
sh_ settings put global window_animation_scale 0
sh_ settings put global transition_animation_scale 0
sh_ settings put global animator_duration_scale 0
# Chrome without its welcome, sign-in and default-browser screens (google_apis images allow root).
adb -s "$SERIAL" root >/dev/null
adb -s "$SERIAL" wait-for-device
sh_ "echo 'chrome --disable-fre --no-default-browser-check --no-first-run' > /data/local/tmp/chrome-command-line"
sh_ chmod 644 /data/local/tmp/chrome-command-line
sh_ am set-debug-app --persistent com.android.chrome
# Unlock, close whatever first-run dialog is up, and go home.
sh_ input keyevent 82
sh_ input keyevent 4
sh_ input keyevent 3
sleep 5
adb -s "$SERIAL" emu avd snapshot save "$SNAPSHOT"
echo "saved snapshot $SNAPSHOT of $AVD_NAME"
