#!/bin/sh
# Installs the Debian packages listed in deps/apt-packages.txt that are not installed yet.
# Fast when nothing is missing (one dpkg-query); runs apt-get update only when it must install.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
wanted=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/apt-packages.txt")
missing=""
for pkg in $wanted; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    case "$status" in
        *"install ok installed"*) ;;
        *) missing="$missing $pkg" ;;
    esac
done
[ -z "$missing" ] && exit 0
echo "installing Debian packages:$missing"
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "error: need root (or sudo) to apt-get install:$missing" >&2; exit 1; }
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
# Debian starts the packaged daemons; the stack runs its own on other terms, so free the ports.
for svc in nginx memcached postgresql; do
    case " $missing " in *" $svc "*)
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
            $SUDO systemctl stop "$svc" || true; $SUDO systemctl disable "$svc" >/dev/null 2>&1 || true
        elif command -v service >/dev/null 2>&1; then
            $SUDO service "$svc" stop >/dev/null 2>&1 || true
        fi;;
    esac
done
