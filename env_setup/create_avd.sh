#!/usr/bin/env bash
# Create the AitW phone: a Pixel at API 28 with a 1080x2280 screen at 440 dpi, no skin.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

usage() {
    cat <<USAGE
usage: $0 [-h]
Creates AVD $AVD_NAME (set AVD_NAME to change it) from $SYSTEM_IMAGE:
Pixel, 1080x2280, 440 dpi, no skin, 2 GB RAM. Replaces an AVD of that name.
Verify: emulator -list-avds   (lists $AVD_NAME)
USAGE
}

help_or_no_args "$@"

need avdmanager "run env_setup/install_sdk.sh first"

# "no": do not create a custom hardware profile (avdmanager asks).
echo no | avdmanager create avd --force --name "$AVD_NAME" --package "$SYSTEM_IMAGE" --device pixel

config="${ANDROID_AVD_HOME:-$HOME/.android/avd}/$AVD_NAME.avd/config.ini"
[ -f "$config" ] || die "avdmanager did not write $config"

# set_ini KEY VALUE: set KEY in the AVD's config.ini, replacing an existing line.
set_ini() {
    if grep -q "^$1=" "$config"; then
        sed -i "s|^$1=.*|$1=$2|" "$config"
    else
        echo "$1=$2" >>"$config"
    fi
}
set_ini hw.lcd.width 1080
set_ini hw.lcd.height 2280
set_ini hw.lcd.density 440
set_ini hw.ramSize 2048
set_ini hw.keyboard yes
set_ini skin.dynamic no
set_ini showDeviceFrame no
sed -i '/^skin\.name=/d; /^skin\.path=/d' "$config"
echo "created $AVD_NAME ($config)"
