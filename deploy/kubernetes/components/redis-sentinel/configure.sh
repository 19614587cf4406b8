#!/bin/sh
# Writes this pod's redis.conf and sentinel.conf into /config (the init container of redis.yaml).
# The primary is the server the sentinels name now, so a pod that restarts rejoins as a replica of
# the current primary; when no sentinel answers (the very first start), redis-0 is the primary.
# The password comes from the Secret (REDIS_PASSWORD), never from this ConfigMap.
set -eu
SERVICE="${SENTINEL_SERVICE:-toolsearch}"
CONFIG="${CONFIG_DIR:-/config}"  # another folder only for a dry run outside the pod
# the pods' names as every pod of the cluster resolves them: the StatefulSet's headless Service in
# this pod's namespace, under the cluster's DNS domain (the overlay's cluster-domain parameter)
DOMAIN="redis.${POD_NAMESPACE}.svc.${CLUSTER_DOMAIN:-cluster.local}"
SELF="${HOSTNAME}.${DOMAIN}"
PRIMARY=""
for i in 0 1 2; do
  answer="$(REDISCLI_AUTH="" timeout 3 redis-cli -h "redis-$i.$DOMAIN" -p 26379 --raw \
    sentinel get-master-addr-by-name "$SERVICE" 2>/dev/null | head -n 1)" || answer=""
  if [ -n "$answer" ]; then
    PRIMARY="$answer"
    break
  fi
done
[ -n "$PRIMARY" ] || PRIMARY="redis-0.$DOMAIN"

{
  echo "port 6379"
  echo "dir /data"
  echo "appendonly yes"             # a restart of every pod at once keeps the data too
  echo "appendfsync everysec"
  echo "maxmemory 384mb"            # under the container's 512Mi limit, with room for a rewrite
  echo "maxmemory-policy noeviction" # a full Redis refuses writes (503) rather than drop sessions
  echo "replica-announce-ip $SELF"
  echo "requirepass $REDIS_PASSWORD"
  echo "masterauth $REDIS_PASSWORD"
  # a primary cut off from every replica stops taking writes after 10 s, so a primary the
  # sentinels have replaced cannot go on acknowledging writes that the failover will drop
  echo "min-replicas-to-write 1"
  echo "min-replicas-max-lag 10"
  if [ "$PRIMARY" != "$SELF" ]; then
    echo "replicaof $PRIMARY 6379"
  fi
} > "$CONFIG/redis.conf"

{
  echo "port 26379"
  echo "dir /tmp"
  echo "sentinel resolve-hostnames yes"
  echo "sentinel announce-hostnames yes"
  echo "sentinel announce-ip $SELF"
  echo "sentinel monitor $SERVICE $PRIMARY 6379 2"
  echo "sentinel auth-pass $SERVICE $REDIS_PASSWORD"
  echo "sentinel down-after-milliseconds $SERVICE 5000"
  echo "sentinel failover-timeout $SERVICE 60000"
  echo "sentinel parallel-syncs $SERVICE 1"
} > "$CONFIG/sentinel.conf"
echo "configured $SELF: primary $PRIMARY"
