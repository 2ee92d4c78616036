"""The JVM reader's pure parts: its jar built from the sources once per input and refused clearly without a JDK,
and the plan handed to it (signed URLs, no credentials, the slices' rules as the Python source reads them)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from deploy.spark_jars import spark_jars
from reader.spark import jvm_jar
from reader.spark.jvm_source import plan_json
from reader.spark.slices import SlicePack
from tests.decoders import KEY, slice_over
from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.stores.config import S3StoreConfig
from tiering_core.stores.filesystem import FileSystemStore
from tiering_core.stores.prefixed import PrefixedStore
from tiering_core.stores.s3 import S3Store


def test_the_jar_is_built_once_per_input_and_refused_without_a_jdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:  # fmt: skip
    jars = spark_jars()  # from the setup's cache, before the cache moves to tmp_path
    monkeypatch.setenv("TIERING_CACHE_DIR", str(tmp_path / "cache"))
    jar = jvm_jar.source_jar(jars)
    with zipfile.ZipFile(jar) as built:
        names = set(built.namelist())
    assert "io/github/kafkatiering/spark/TieredSlicesSource.class" in names
    assert "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister" in names
    stamp = jar.stat().st_mtime_ns
    assert jvm_jar.source_jar(jars) == jar and jar.stat().st_mtime_ns == stamp, "built again for the same inputs"

    monkeypatch.setenv("TIERING_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac on it
    with pytest.raises(jvm_jar.JvmReaderUnavailable, match="no javac"):
        jvm_jar.source_jar(jars)
    with pytest.raises(jvm_jar.JvmReaderUnavailable, match="no kafka-clients jar"):
        jvm_jar.source_jar([j for j in jars if "kafka-clients" not in j])


def test_the_plan_signs_each_object_once_and_carries_no_credentials() -> None:
    config = S3StoreConfig(bucket="b", endpoint_url="http://127.0.0.1:9", region="us-east-1", path_style=True,
                           access_key_id="AKIDEXAMPLE", secret_access_key="very-secret")  # fmt: skip
    store = PrefixedStore(S3Store(config), "cluster-1")
    data = encode_batch(0, sample_records(30, seed=1))
    whole = slice_over(data, 0, 29, ((77, 3, 9),))
    half = slice_over(data, 10, 19)
    text = plan_json([SlicePack((whole,)), SlicePack((half,))], store, max_rows=100, max_bytes=1 << 20)
    assert "very-secret" not in text
    plan = json.loads(text)
    first, second = plan["packs"][0]["slices"][0], plan["packs"][1]["slices"][0]
    url = urlsplit(first["url"])
    assert url.path == f"/b/cluster-1/{KEY}" and "X-Amz-Signature" in parse_qs(url.query)
    assert parse_qs(url.query)["X-Amz-Expires"] == ["21600"]
    assert second["url"] == first["url"], "an object signed twice"
    assert (first["key"], first["start"], first["end"], first["object_size"]) == (KEY, 0, len(data), len(data))
    assert first["object_crc32c"] == whole.copy.manifest.log_crc32c and first["aborted"] == [[77, 3, 9]]
    assert (second["first_offset"], second["last_offset"]) == (10, 19)
    assert plan["max_rows_per_batch"] == 100 and plan["max_batch_bytes"] == 1 << 20


def test_the_filesystem_store_gives_file_urls(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    assert store.read_url("t/0/x.log", 60) == (tmp_path / "t/0/x.log").resolve().as_uri()
