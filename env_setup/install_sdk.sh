#!/usr/bin/env bash
# Install the Android command-line tools, platform-tools, the emulator and the
# AitW system image (API 28, Google APIs, x86_64) into $ANDROID_HOME, and accept the licenses.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

CMDLINE_TOOLS_VERSION="${CMDLINE_TOOLS_VERSION:-11076708}"

usage() {
    cat <<USAGE
usage: $0 [-h]
Installs into ANDROID_HOME=$ANDROID_HOME (set ANDROID_HOME to change it):
  cmdline-tools (build $CMDLINE_TOOLS_VERSION), platform-tools, emulator, $SYSTEM_IMAGE
Needs: curl, unzip, Java 17+ (Debian/Ubuntu: apt-get install openjdk-17-jre-headless), ~10 GB free disk.
Verify: sdkmanager --list_installed
USAGE
}

help_or_no_args "$@"

need curl "install curl"
need unzip "install unzip"
need java "install Java 17+ (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"

if [ ! -x "$ANDROID_HOME/cmdline-tools/latest/bin/sdkmanager" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    url="https://dl.google.com/android/repository/commandlinetools-linux-${CMDLINE_TOOLS_VERSION}_latest.zip"
    echo "downloading $url"
    curl -fL --retry 3 -o "$tmp/tools.zip" "$url"
    unzip -q "$tmp/tools.zip" -d "$tmp"
    mkdir -p "$ANDROID_HOME/cmdline-tools"
    rm -rf "$ANDROID_HOME/cmdline-tools/latest"
    mv "$tmp/cmdline-tools" "$ANDROID_HOME/cmdline-tools/latest"
fi

# sdkmanager asks to accept each license; `yes` answers, and its SIGPIPE at the end is expected.
yes | sdkmanager --licenses >/dev/null || true
sdkmanager --install "platform-tools" "emulator" "$SYSTEM_IMAGE"
sdkmanager --list_installed
echo "done: add this to your shell profile:"
echo "  export ANDROID_HOME=$ANDROID_HOME PATH=\"$ANDROID_HOME/platform-tools:$ANDROID_HOME/emulator:\$PATH\""
