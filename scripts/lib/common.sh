# shellcheck shell=bash
# Helpers shared by the launch scripts: logging, dry-run aware execution, input checks.
# Sourced (not executed); the sourcing script sets `set -euo pipefail` and SCRIPT_NAME.

DRY_RUN="${DRY_RUN:-0}"
# Problems found by the check_* helpers; reported together by finish_checks.
CHECK_ERRORS=()

log() {
    printf '[%s] %s\n' "${SCRIPT_NAME:-launch}" "$*" >&2
}

die() {
    log "error: $*"
    exit 1
}

# True for 1/true/yes/on (any case); false for 0/false/no/off/empty; anything else is an error.
is_true() {
    case "${1,,}" in
        1 | true | yes | on) return 0 ;;
        0 | false | no | off | "") return 1 ;;
        *) die "expected a boolean (1/0, true/false, yes/no, on/off), got '$1'" ;;
    esac
}

dry_run() {
    is_true "$DRY_RUN"
}

# Print a command as one shell-quoted line, so it can be copied or parsed with shlex.
print_cmd() {
    local quoted
    printf -v quoted '%q ' "$@"
    printf '+ %s\n' "${quoted% }"
}

# Run a command, or only print it in dry-run mode.
run() {
    if dry_run; then
        print_cmd "$@"
    else
        print_cmd "$@" >&2
        "$@"
    fi
}

# require_int NAME MIN: the variable NAME must hold an integer >= MIN.
require_int() {
    local name="$1" min="$2" value="${!1-}"
    [[ "$value" =~ ^[0-9]+$ ]] || die "$name must be a non-negative integer, got '$value'"
    ((10#$value >= min)) || die "$name must be >= $min, got $value"
}

# check_file/check_dir DESCRIPTION PATH [HINT]: record a problem if PATH is missing.
# In dry-run mode a missing path is only noted, since dry runs happen away from the GPU box.
check_file() {
    [[ -f "$2" ]] || _check_failed "$1 not found: $2${3:+ ($3)}"
}

check_dir() {
    [[ -d "$2" ]] || _check_failed "$1 not found: $2${3:+ ($3)}"
}

_check_failed() {
    if dry_run; then
        log "note (dry run, not fatal): $1"
    else
        CHECK_ERRORS+=("$1")
    fi
}

# Stop before starting anything if a check failed, listing every problem at once.
finish_checks() {
    if ((${#CHECK_ERRORS[@]} > 0)); then
        log "error: cannot start:"
        local problem
        for problem in "${CHECK_ERRORS[@]}"; do
            log "  - $problem"
        done
        exit 1
    fi
}

require_commands() {
    local command_name
    for command_name in "$@"; do
        command -v "$command_name" >/dev/null 2>&1 || _check_failed "command '$command_name' not on PATH"
    done
}
