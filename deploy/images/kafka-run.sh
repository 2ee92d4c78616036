#!/bin/sh
# Entry point of the Kafka image: format the node's storage on its first start (static KRaft voters,
# so the cluster id is all it needs), then run the broker. /kafka holds server.properties,
# log4j2.properties and data/ (log.dirs), mounted from the host by deploy/container_stack.py, which
# also sets KAFKA_CLUSTER_ID and KAFKA_JVM_OPTS.
set -eu
classpath='/opt/kafka/libs/*'
logging="-Dlog4j2.configurationFile=file:/kafka/log4j2.properties -Dkafka.logs.dir=/kafka"
if [ ! -f /kafka/data/meta.properties ]; then
    # shellcheck disable=SC2086
    java $KAFKA_JVM_OPTS $logging -cp "$classpath" kafka.tools.StorageTool format \
        -t "$KAFKA_CLUSTER_ID" -c /kafka/server.properties
fi
# shellcheck disable=SC2086
exec java $KAFKA_JVM_OPTS $logging -cp "$classpath" kafka.Kafka /kafka/server.properties
