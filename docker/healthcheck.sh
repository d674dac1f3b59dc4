#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on ztraind's HTTP port through bash's /dev/tcp, so that
# the image needs no curl. /healthz needs no token. Healthy: the status line says 200.
set -u
port="${ZTRAIN_HEALTH_PORT:-8080}"
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
IFS=$' \r' read -r -t 4 version status _ <&3 || { echo "healthz: no answer on port $port"; exit 1; }
[ "$status" = 200 ] || { echo "healthz: $version $status"; exit 1; }
