#!/bin/bash
# The MAP's entry point (/var/holoscan/tools), written by `monai-triton package`.
#
#   (no command) [ARGS...]   run the app: app.json#command plus ARGS; its exit code is the container's
#   show [app|pkg]           print the manifests
#   export | extract         copy app, config (app.yaml, app.json, pkg.json), models and docs into the mounted
#                            /var/run/holoscan/export[/app|/config|/models|/docs]
#   env                      print the environment
#   help                     this text
set -euo pipefail

: "${HOLOSCAN_APPLICATION:=/opt/holoscan/app}"
: "${HOLOSCAN_MODEL_PATH:=/opt/holoscan/models}"
: "${HOLOSCAN_DOCS_PATH:=/opt/holoscan/docs}"
: "${HOLOSCAN_CONFIG_PATH:=/var/holoscan/app.yaml}"
: "${HOLOSCAN_APP_MANIFEST_PATH:=/etc/holoscan/app.json}"
: "${HOLOSCAN_PKG_MANIFEST_PATH:=/etc/holoscan/pkg.json}"
EXPORT_ROOT=/var/run/holoscan/export

log() { echo "$(date -u '+%Y-%m-%d %H:%M:%S') [tools] $*" >&2; }

usage() { sed -n '3,10p' "$0" | sed 's/^# \{0,1\}//'; }

show() {
    local which="${1:-all}"
    if [[ "$which" == all || "$which" == app ]]; then
        echo "============================== app.json =============================="
        python3 -m json.tool "$HOLOSCAN_APP_MANIFEST_PATH"
    fi
    if [[ "$which" == all || "$which" == pkg ]]; then
        echo "============================== pkg.json =============================="
        python3 -m json.tool "$HOLOSCAN_PKG_MANIFEST_PATH"
    fi
    if [[ "$which" != all && "$which" != app && "$which" != pkg ]]; then
        log "show: unknown manifest '$which' (app or pkg)"
        return 2
    fi
}

copy_into() {  # SRC DEST: copy a folder's contents, or one file
    local src="$1" dest="$2"
    if [[ ! -e "$src" ]]; then
        log "export: $src does not exist, skipped"
        return 0
    fi
    if [[ ! -w "$dest" ]]; then
        log "export: $dest is not writable (create it on the host first, writable by uid $(id -u))"
        return 2
    fi
    if [[ -d "$src" ]]; then cp -r "$src"/. "$dest"/; else cp "$src" "$dest"/; fi
    log "export: $src -> $dest"
}

export_config() {
    local dest="$1"
    copy_into "$HOLOSCAN_CONFIG_PATH" "$dest"
    copy_into "$HOLOSCAN_APP_MANIFEST_PATH" "$dest"
    copy_into "$HOLOSCAN_PKG_MANIFEST_PATH" "$dest"
}

export_all() {
    if [[ ! -d "$EXPORT_ROOT" ]]; then
        log "export: mount a host folder at $EXPORT_ROOT (or at its app/, config/, models/ or docs/)"
        return 2
    fi
    local found=0
    if [[ -d "$EXPORT_ROOT/app" ]]; then copy_into "$HOLOSCAN_APPLICATION" "$EXPORT_ROOT/app"; found=1; fi
    if [[ -d "$EXPORT_ROOT/config" ]]; then export_config "$EXPORT_ROOT/config"; found=1; fi
    if [[ -d "$EXPORT_ROOT/models" ]]; then copy_into "$HOLOSCAN_MODEL_PATH" "$EXPORT_ROOT/models"; found=1; fi
    if [[ -d "$EXPORT_ROOT/docs" ]]; then copy_into "$HOLOSCAN_DOCS_PATH" "$EXPORT_ROOT/docs"; found=1; fi
    if [[ "$found" == 0 ]]; then
        local part
        for part in app config models docs; do mkdir -p "$EXPORT_ROOT/$part"; done
        copy_into "$HOLOSCAN_APPLICATION" "$EXPORT_ROOT/app"
        export_config "$EXPORT_ROOT/config"
        copy_into "$HOLOSCAN_MODEL_PATH" "$EXPORT_ROOT/models"
        copy_into "$HOLOSCAN_DOCS_PATH" "$EXPORT_ROOT/docs"
    fi
}

run_app() {
    local -a command
    # app.json#command is a JSON array stored as a string (holoscan-cli's form); NUL-separated words survive spaces.
    mapfile -d '' -t command < <(python3 -c '
import json, sys
value = json.load(open(sys.argv[1]))["command"]
words = json.loads(value) if isinstance(value, str) and value.lstrip().startswith("[") else value
words = words.split() if isinstance(words, str) else words
sys.stdout.write("".join(f"{w}\0" for w in words))' "$HOLOSCAN_APP_MANIFEST_PATH")
    if [[ ${#command[@]} -eq 0 ]]; then
        log "no command in $HOLOSCAN_APP_MANIFEST_PATH"
        return 2
    fi
    exec "${command[@]}" "$@"  # the app becomes the container's process: signals and the exit code are its own
}

case "${1:-}" in
    show) shift; show "$@" ;;
    export | extract) shift; export_all ;;
    env) env | sort ;;
    help | --help-map) usage ;;
    *) run_app "$@" ;;
esac
