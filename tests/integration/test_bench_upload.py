"""``tiering bench upload`` runs end to end on the real stack and ends with its JSON summary."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deploy.stack import Endpoints
from tiering.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_upload_prints_both_sides_and_a_json_summary_last(stack: Endpoints) -> None:
    result = CliRunner().invoke(
        main, ["bench", "upload", "--stack-dir", stack.stack_dir, "--size-mb", "64"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    *sides, summary = lines
    assert [s["side"] for s in sides] == ["boto3", "ours", "ours", "boto3"]  # two rounds by default, ABBA
    for side in sides:
        assert side["seconds"] > 0 and side["cpu_seconds"] > 0 and side["puts"] > 0 and side["peak_rss_mb"] > 0
    keys = {"ratio", "ours_mb_s", "boto3_mb_s", "peak_rss_mb", "boto3_peak_rss_mb", "cpu_s_per_gb",
            "boto3_cpu_s_per_gb", "puts_per_gb", "boto3_puts_per_gb", "bytes", "files", "rounds"}  # fmt: skip
    assert set(summary) >= keys and summary["rounds"] == 2
    assert summary["bytes"] >= 16 << 20 and summary["files"] >= 1
    gb = 2 * summary["bytes"] / 1e9
    for name, side in (("", "ours"), ("boto3_", "boto3")):
        mine = [s for s in sides if s["side"] == side]
        assert summary[f"{name}cpu_s_per_gb"] == round(sum(s["cpu_seconds"] for s in mine) / gb, 2)
        assert summary[f"{name}peak_rss_mb"] == round(max(s["peak_rss_mb"] for s in mine), 1)
        seconds = sum(s["seconds"] for s in mine)
        assert summary[f"{side}_mb_s"] == round(2 * summary["bytes"] / 1e6 / seconds, 1)
    # ours also PUTs each copy's .indexes and manifest: as many PUTs for the .log, two more per file
    ours, boto3 = sides[1], sides[0]
    assert ours["puts"] == boto3["puts"] + 2 * summary["files"] and summary["ratio"] > 0
