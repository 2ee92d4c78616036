#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian machine (run as root), idempotently:
# etcd (and kcat, a reader the tests check the access layer with, promtool and PostgreSQL) from Debian, this package with its test extras, Kafka's jars (and Iceberg's REST catalog server's) from Maven Central and MinIO
# built with `go install` (all cached under ${TIERING_CACHE_DIR:-~/.cache/tiering}); for the
# containers backend, podman, runc and debootstrap from Debian (the images are built by
# `tiering dev images`, which .ci/run calls, or on a stack's first start).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pair in etcd:etcd-server podman:podman runc:runc debootstrap:debootstrap kcat:kcat; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# promtool checks the shipped alert rules and dashboard queries (deploy/monitoring/) in the tests. It comes with
# Debian's prometheus package, whose server is not wanted here: no recommends (node exporter), not enabled.
if ! command -v promtool >/dev/null 2>&1; then
    echo "setup: installing promtool (Debian's prometheus package; its service stays off)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled prometheus >/dev/null 2>&1; then
        systemctl disable --now prometheus >/dev/null 2>&1 || echo "setup: could not stop the prometheus service" >&2
    fi
fi
# PostgreSQL: the database of the Iceberg SQL catalog the export's tests commit to (each test starts its own
# server on 127.0.0.1; the cluster Debian's package creates is stopped, not used).
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    echo "setup: installing PostgreSQL from Debian (its own cluster stays stopped)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    if command -v pg_lsclusters >/dev/null 2>&1; then
        pg_lsclusters -h | while read -r version cluster _; do
            pg_ctlcluster "$version" "$cluster" stop >/dev/null 2>&1 || true
        done
    fi
fi
for tool in java mvn go python3 cargo; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/local/go/bin/$tool" ]; then
        echo "setup: $tool is required but not installed" >&2
        exit 1
    fi
done
export PATH="$PATH:/usr/local/go/bin"

echo "setup: installing the Python package and test extras (with PySpark and pyarrow for the export)"
# A failed install fails the setup (and CI): pip's exit status is the step's, only its root warning is hidden.
PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check -e '.[test]'
echo "setup: building the compiled record decoder (native/: Rust with PyO3 through maturin; minutes the first time)"
PIP_ROOT_USER_ACTION=ignore python3 -m pip wheel -q --disable-pip-version-check --no-deps -w native/dist ./native
PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    native/dist/tiering_native-*.whl

# pyenv's pip hook does not rehash for `python3 -m pip`: make the new `tiering` script visible.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi

echo "setup: fetching Kafka, Delta and Spark Kafka source jars and building MinIO (first time only; minutes)"
python3 -m tiering dev fetch
echo "setup: building the Spark export's JVM reader (reader/spark/jvm/, javac against PySpark's jars; seconds)"
python3 -m reader.spark.jvm_jar
# Iceberg's REST catalog server, the third catalog of the Iceberg export's tests (deploy/iceberg_rest.py; its jars are
# fetched on a test's first use otherwise).
echo "setup: fetching Iceberg's REST catalog server jars (first time only)"
python3 -c 'from deploy.iceberg_rest import fetch_jars; fetch_jars()'
