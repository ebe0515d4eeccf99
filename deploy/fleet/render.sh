#!/usr/bin/env bash
# Writes the nginx configuration of a trainwatch fleet (docs/fleet.md) to
# stdout: one address for trainers, each run's calls routed by their
# x-trainwatch-run header to one of the SERVERS with consistent hashing.
#
#   deploy/fleet/render.sh [options] SERVER...      SERVER: host:port of a
#                                                    trainwatch-server (gRPC)
# Options:
#   --listen PORT|ADDR:PORT  where trainers connect (default 50051)
#   --tls-cert FILE --tls-key FILE
#                            trainers connect with TLS (PEM certificate chain
#                            and key of the proxy's name)
#   --tls-client-ca FILE     ... and must show a client certificate signed by
#                            these CAs (mutual TLS at the proxy)
#   --upstream-tls           the servers serve TLS (--tls-cert/--tls-key on
#                            trainwatch-server): the proxy connects with TLS
#   --upstream-ca FILE       CAs the servers' certificates chain to (verified)
#   --upstream-name NAME     name the servers' certificates carry (default
#                            trainwatch-server); one name for all of them
#   --upstream-cert FILE --upstream-key FILE
#                            client certificate the proxy shows to servers
#                            started with --tls-client-ca
#   --access-log FILE|off    (default /var/log/nginx/trainwatch-fleet.log)
#   --standalone DIR         a whole nginx.conf that keeps its pid, logs and
#                            temporary files in DIR, for `nginx -c FILE -p DIR
#                            -e DIR/error.log -g 'daemon off;'` as any user
#                            (tests, a proxy without root)
#
# Without --standalone the output is an http-level snippet for Debian's nginx
# (/etc/nginx/conf.d/trainwatch-fleet.conf) or the nginx image in Kubernetes
# (/etc/nginx/conf.d/, deploy/k8s/proxy.yaml). Every proxy replica rendered
# from the same SERVER list routes every run to the same server: the hash ring
# is built from the SERVER strings, so keep them identical everywhere (their
# order does not matter).
set -euo pipefail

usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
command_line="deploy/fleet/render.sh $*"

listen=50051
tls_cert="" tls_key="" tls_client_ca=""
upstream_tls=0 upstream_ca="" upstream_name=trainwatch-server
upstream_cert="" upstream_key=""
access_log=/var/log/nginx/trainwatch-fleet.log
standalone=""
servers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --listen) listen=${2:?}; shift 2 ;;
    --tls-cert) tls_cert=${2:?}; shift 2 ;;
    --tls-key) tls_key=${2:?}; shift 2 ;;
    --tls-client-ca) tls_client_ca=${2:?}; shift 2 ;;
    --upstream-tls) upstream_tls=1; shift ;;
    --upstream-ca) upstream_ca=${2:?}; upstream_tls=1; shift 2 ;;
    --upstream-name) upstream_name=${2:?}; shift 2 ;;
    --upstream-cert) upstream_cert=${2:?}; upstream_tls=1; shift 2 ;;
    --upstream-key) upstream_key=${2:?}; upstream_tls=1; shift 2 ;;
    --access-log) access_log=${2:?}; shift 2 ;;
    --standalone) standalone=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    --) shift; servers+=("$@"); break ;;
    -*) echo "render.sh: unknown option $1" >&2; usage ;;
    *) servers+=("$1"); shift ;;
  esac
done
[ ${#servers[@]} -gt 0 ] || { echo "render.sh: no SERVER given" >&2; usage; }
host_port='^[][A-Za-z0-9._:-]+:[0-9]+$'
for s in "${servers[@]}"; do
  [[ "$s" =~ $host_port ]] || {
    echo "render.sh: $s: want host:port" >&2; exit 2; }
done
if { [ -n "$tls_cert" ] && [ -z "$tls_key" ]; } || { [ -z "$tls_cert" ] && [ -n "$tls_key" ]; }; then
  echo "render.sh: --tls-cert and --tls-key go together" >&2; exit 2
fi
if { [ -n "$upstream_cert" ] && [ -z "$upstream_key" ]; } || { [ -z "$upstream_cert" ] && [ -n "$upstream_key" ]; }; then
  echo "render.sh: --upstream-cert and --upstream-key go together" >&2; exit 2
fi

snippet() {
  local ind="$1"  # indentation: the snippet sits inside http { } standalone
  local scheme=grpc
  [ "$upstream_tls" = 1 ] && scheme=grpcs
  local listen_opts="http2"
  [ -n "$tls_cert" ] && listen_opts="ssl http2"
  # Optional lines, each block ending in a newline (or empty).
  local tls_block="" upstream_tls_block=""
  if [ -n "$tls_cert" ]; then
    tls_block+="    ssl_certificate ${tls_cert};"$'\n'
    tls_block+="    ssl_certificate_key ${tls_key};"$'\n'
    tls_block+="    ssl_protocols TLSv1.2 TLSv1.3;"$'\n'
  fi
  if [ -n "$tls_client_ca" ]; then
    tls_block+="    ssl_client_certificate ${tls_client_ca};"$'\n'
    tls_block+="    ssl_verify_client on;"$'\n'
  fi
  if [ "$upstream_tls" = 1 ]; then
    upstream_tls_block+="        grpc_ssl_server_name on;"$'\n'
    upstream_tls_block+="        grpc_ssl_name ${upstream_name};"$'\n'
    upstream_tls_block+="        grpc_ssl_protocols TLSv1.2 TLSv1.3;"$'\n'
    if [ -n "$upstream_ca" ]; then
      upstream_tls_block+="        grpc_ssl_verify on;"$'\n'
      upstream_tls_block+="        grpc_ssl_trusted_certificate ${upstream_ca};"$'\n'
    fi
    if [ -n "$upstream_cert" ]; then
      upstream_tls_block+="        grpc_ssl_certificate ${upstream_cert};"$'\n'
      upstream_tls_block+="        grpc_ssl_certificate_key ${upstream_key};"$'\n'
    fi
  fi
  sed "s/^/$ind/; s/^ *$//" <<CONF
# trainwatch fleet proxy (docs/fleet.md), rendered by
# ${command_line}

upstream trainwatch_servers {
    # Each call goes to the server its x-trainwatch-run header hashes to, on
    # a ring of points per server (ketama): adding or removing one of N
    # servers moves about 1/N of the runs. Calls without the header (a
    # listing of all runs) go to any server: trainwatchctl asks each server
    # for those (--server A,B,C).
    hash \$http_x_trainwatch_run consistent;
$(for s in "${servers[@]}"; do
    printf '    server %s max_fails=0;\n' "$s"
  done)
    # max_fails=0: a server is never taken out of the ring, so while it is
    # down its runs are not hashed to another server (their history would
    # split); the trainers' clients buffer and resend until it is back.
    keepalive 32;
}

log_format trainwatch_fleet '\$remote_addr [\$time_local] "\$request" \$status '
                            'run=\$http_x_trainwatch_run upstream=\$upstream_addr '
                            'grpc_status=\$sent_trailer_grpc_status '
                            'bytes_in=\$request_length time=\$request_time';

server {
    listen ${listen} ${listen_opts};
${tls_block}    access_log ${access_log}$([ "$access_log" = off ] || echo " trainwatch_fleet");

    # A Report stream lives as long as the training run and may be quiet for
    # as long as a checkpoint or an evaluation takes: no body size limit (a
    # gRPC stream is one request body) and day-long timeouts between reads.
    client_max_body_size 0;
    client_body_timeout 1d;
    keepalive_timeout 1d;
    keepalive_requests 1000000;
    # Room for the metadata (a bearer token, the run header).
    large_client_header_buffers 4 16k;

    location / {
        grpc_pass ${scheme}://trainwatch_servers;
        # Never retry a call on another server: a run's steps must all land
        # in one database. The client retries the same run, which hashes to
        # the same server again.
        grpc_next_upstream off;
        grpc_connect_timeout 5s;
        grpc_read_timeout 1d;
        grpc_send_timeout 1d;
        grpc_socket_keepalive on;
        # Large answers (steps, alerts) are streamed, not held.
        grpc_buffer_size 64k;
${upstream_tls_block}    }
}
CONF
}

if [ -z "$standalone" ]; then
  snippet ""
  exit 0
fi
cat <<CONF
# A standalone nginx for the trainwatch fleet proxy: pid, logs and temporary
# files under ${standalone} (deploy/fleet/render.sh --standalone).
worker_processes 2;
pid ${standalone}/nginx.pid;
error_log ${standalone}/error.log notice;

events {
    worker_connections 4096;
}

http {
    client_body_temp_path ${standalone}/client_body;
    proxy_temp_path ${standalone}/proxy;
    fastcgi_temp_path ${standalone}/fastcgi;
    uwsgi_temp_path ${standalone}/uwsgi;
    scgi_temp_path ${standalone}/scgi;

CONF
snippet "    "
echo "}"
