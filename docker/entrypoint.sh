#!/bin/sh
# The image's entry point (run under tini): ztraind listening on all interfaces of the container,
# its SQLite state, data and run directories on the image's volumes, the dashboard from
# /usr/share/ztrain/web. The container's arguments are appended, and ztraind takes the last value
# of a repeated flag, so `docker run IMAGE --grace 60 --max-ranks 4` overrides a default here.
#
# The token: the file named by ZTRAIN_TOKEN_FILE, else the secret /run/secrets/ztrain_token when
# it is mounted (compose `secrets:`, Kubernetes), else ZTRAIN_TOKEN (ztraind reads it itself).
set -eu

# The same rule as ztrain and ztraind: ZTRAIN_TOKEN_FILE names a file, ZTRAIN_TOKEN is the token;
# both set is refused rather than one silently ignored.
if [ -n "${ZTRAIN_TOKEN_FILE:-}" ] && [ -n "${ZTRAIN_TOKEN:-}" ]; then
  echo "ztraind-entrypoint: both ZTRAIN_TOKEN_FILE and ZTRAIN_TOKEN are set: unset one" >&2
  exit 2
fi
token_file="${ZTRAIN_TOKEN_FILE:-}"
if [ -z "$token_file" ] && [ -f /run/secrets/ztrain_token ]; then
  token_file=/run/secrets/ztrain_token
fi
if [ -n "$token_file" ]; then
  set -- --token-file "$token_file" "$@"
elif [ -z "${ZTRAIN_TOKEN:-}" ]; then
  echo "ztraind-entrypoint: no token (mount /run/secrets/ztrain_token or set ZTRAIN_TOKEN):" \
    "whoever reaches the published ports can submit jobs" >&2
fi

# --grace 20 leaves a running job 20 s to checkpoint on `docker stop`; give the container a longer
# stop timeout (docker stop -t 30, compose stop_grace_period: 30s) or it is killed before that.
exec /usr/local/bin/ztraind --grpc-addr 0.0.0.0:50051 --http-addr 0.0.0.0:8080 \
  --state-dir /var/lib/ztrain/state --data-root /data --runs-root /runs \
  --web-dir /usr/share/ztrain/web --grace 20 "$@"
