#!/usr/bin/env bash
# Validates docker-compose.yml without a Docker engine, with a real Compose implementation's
# `config` command: Debian's `docker-compose` package (Compose v1.29, Python; it checks the file
# against the Compose Specification schema and resolves services, profiles,
# depends_on and variables offline), or Compose v2 (`docker compose`) when that is what is on PATH.
# Also checks the two gateway configurations the compose file mounts with `slagate check-config`.
#
# Installs nothing. CI needs:  apt-get install -y --no-install-recommends docker-compose
# (and node with `npm ci` done, for check-config).
#
#   deploy/validate-compose.sh [COMPOSE_FILE]      # default: docker-compose.yml at the repo root
#
# Exit: 0 valid; 1 invalid; 2 no validator installed or bad usage.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
file="${1:-$root/docker-compose.yml}"
if [ ! -f "$file" ]; then
  echo "validate-compose: no such file: $file" >&2
  exit 2
fi
dir="$(cd "$(dirname "$file")" && pwd)"
file="$dir/$(basename "$file")"

if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
elif command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  echo "validate-compose: no Compose implementation found; install Debian's 'docker-compose' package" >&2
  exit 2
fi
echo "validator: $("${compose[@]}" version 2>/dev/null | head -n 1)"

status=0
# Each run: a label, then environment assignments, then compose arguments.
check() {
  local label="$1"
  shift
  local envs=()
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do
    envs+=("$1")
    shift
  done
  local out
  # --project-directory: relative paths in the file resolve as they would for `docker compose up`.
  # (The envs expansion guards an empty list: bash before 4.4 calls it unbound under set -u.)
  if out=$(cd "$dir" && env ${envs[@]+"${envs[@]}"} "${compose[@]}" --project-directory "$dir" -f "$file" "$@" config -q 2>&1); then
    echo "ok: $label"
    [ -n "$out" ] && printf '%s\n' "$out"
  else
    echo "INVALID: $label" >&2
    printf '%s\n' "$out" >&2
    status=1
  fi
}

check "$(basename "$file") (default profile)"
check "$(basename "$file") (profile gpu, SLAGATE_CONFIG=gateway-gpu.yaml)" \
  SLAGATE_CONFIG=gateway-gpu.yaml HF_TOKEN=dummy --profile gpu

# The files the compose file mounts.
for f in deploy/compose/gateway.yaml deploy/compose/gateway-gpu.yaml deploy/compose/nginx.conf; do
  if [ ! -f "$dir/$f" ]; then
    echo "INVALID: $f (mounted by the compose file) is missing" >&2
    status=1
  fi
done
if command -v node >/dev/null 2>&1 && [ -d "$root/node_modules/esbuild" ]; then
  for f in deploy/compose/gateway.yaml deploy/compose/gateway-gpu.yaml; do
    [ -f "$dir/$f" ] || continue
    if out=$(cd "$root" && node bin/slagate.js check-config "$dir/$f" 2>&1 >/dev/null); then
      echo "ok: slagate check-config $f"
    else
      echo "INVALID: slagate check-config $f" >&2
      printf '%s\n' "$out" >&2
      status=1
    fi
  done
else
  echo "skipped: slagate check-config (node or node_modules missing; run npm ci)"
fi

exit "$status"
