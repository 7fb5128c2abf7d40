# shellcheck shell=bash
# Shared settings and helpers of the env_setup scripts; sourced, not run.
# Every setting can be overridden from the environment.

ANDROID_HOME="${ANDROID_HOME:-$HOME/android-sdk}"
AVD_NAME="${AVD_NAME:-digiq_pixel_api28}"
SNAPSHOT="${SNAPSHOT:-digiq_aitw}"
SYSTEM_IMAGE="${SYSTEM_IMAGE:-system-images;android-28;google_apis;x86_64}"
BOOT_TIMEOUT="${BOOT_TIMEOUT:-600}"
export ANDROID_HOME ANDROID_SDK_ROOT="$ANDROID_HOME"
PATH="$ANDROID_HOME/cmdline-tools/latest/bin:$ANDROID_HOME/platform-tools:$ANDROID_HOME/emulator:$PATH"
export PATH

die() {
    echo "error: $*" >&2
    exit 1
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "$1 not found; $2"
}

# wait_for_boot SERIAL: wait until Android on SERIAL has finished booting (BOOT_TIMEOUT seconds).
wait_for_boot() {
    local serial="$1" waited=0
    timeout "$BOOT_TIMEOUT" adb -s "$serial" wait-for-device || die "$serial did not come up within ${BOOT_TIMEOUT}s"
    until [ "$(adb -s "$serial" shell getprop sys.boot_completed 2>/dev/null | tr -d '\r')" = "1" ]; do
        sleep 2
        waited=$((waited + 2))
        [ "$waited" -lt "$BOOT_TIMEOUT" ] || die "$serial did not finish booting within ${BOOT_TIMEOUT}s"
    done
}

# emulator_args PORT: the headless emulator flags every script uses.
emulator_args() {
    printf '%s\n' -avd "$AVD_NAME" -port "$1" -no-window -no-audio -no-boot-anim -gpu swiftshader_indirect -no-metrics
}

# need_kvm: the emulator needs hardware acceleration; without it an x86_64 image takes hours to boot.
need_kvm() {
    if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
        die "no read-write access to /dev/kvm (see env_setup/README.md, KVM)"
    fi
}

# For scripts that take no arguments: -h/--help prints their usage (each script defines usage), anything else fails.
help_or_no_args() {
    if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
        usage
        exit 0
    fi
    [ "$#" -eq 0 ] || { usage >&2; exit 2; }
}
